"""``Checkpoint``: a directory of files, local or in an object store (Ray
Train's ``ray.train.Checkpoint``)."""

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional

_METADATA = ".metadata.json"


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


class Checkpoint:
    """A checkpoint directory. ``path`` is a local directory or a URL
    (``s3://...``, where ``filesystem`` names the store). A checkpoint nestor
    committed holds each rank's files in ``rank-<r>/``; ``as_directory`` and
    ``to_directory`` show them merged, rank 0's on top, so
    ``os.path.join(d, "model.pt")`` works as in Ray."""

    def __init__(self, path: Any, filesystem: Any = None):
        path = os.fspath(path)
        if path.startswith("file://"):
            path = path[len("file://"):]
        self.path: str = path if _is_url(path) else os.path.abspath(path)
        self.filesystem = filesystem or (path.split("://", 1)[0] if _is_url(path) else None)
        #: The worker's rank, for a worker's checkpoint (see ``_siblings``).
        self._rank: Optional[int] = None
        #: For a shard fetched from the driver: fetches every rank's (a directory of ``rank-<r>/``).
        self._whole: Optional[Callable[[], Optional[str]]] = None

    @classmethod
    def from_directory(cls, path: Any) -> "Checkpoint":
        """The checkpoint held in a local directory (reported as it is; the
        driver copies it into the trial's storage before ``report`` returns)."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError(f"Checkpoint.from_directory: {path} is not a directory")
        return cls(path)

    @classmethod
    def from_dict(cls, *_a: Any, **_k: Any) -> "Checkpoint":
        raise NotImplementedError(
            "Checkpoint.from_dict was removed from Ray in 2.7 and nestor never had it: save files into a directory "
            "and use Checkpoint.from_directory"
        )

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def _shards(self, root: str) -> List[str]:
        names = sorted(n for n in os.listdir(root) if n.startswith("rank-") and n[5:].isdigit())
        if not names:
            return []
        names.sort(key=lambda n: int(n[5:]))
        return [os.path.join(root, n) for n in names]

    def _siblings(self) -> List[str]:
        """For a worker's checkpoint (``train.get_checkpoint()``: a
        ``rank-<r>`` shard of a committed checkpoint), every shard of that
        checkpoint, in the order their files are laid over each other: the
        other ranks', then rank 0's, then this rank's own on top. Empty for
        any other checkpoint."""
        rank = self._rank
        if rank is None or _is_url(self.path):
            return []
        if self._whole is not None:
            # A shard fetched from the driver: the others come from there too, once.
            parent = self._whole()
            if not parent:
                return []
        else:
            parent, name = os.path.split(self.path)
            if not (name.startswith("rank-") and name[5:].isdigit()) or not os.path.isdir(parent):
                return []
        shards = self._shards(parent)
        if len(shards) < 2:
            return []
        own = os.path.join(parent, f"rank-{rank}")
        first = os.path.join(parent, "rank-0")
        rest = [s for s in shards if s not in (own, first)]
        top = [first] if own == first else [first, own]
        return rest + [s for s in top if s in shards]

    def _local(self) -> str:
        if _is_url(self.path):
            return self._download()
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"checkpoint {self.path} does not exist (deleted by num_to_keep, or moved)")
        return self.path

    def _download(self) -> str:
        from . import _binary
        import subprocess

        dest = tempfile.mkdtemp(prefix="nestor-checkpoint-")
        out = subprocess.run([_binary.find(), "fetch", self.path, dest], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if out.returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            raise OSError(f"cannot download {self.path}: {out.stderr.strip()}")
        return dest

    def to_directory(self, path: Optional[Any] = None) -> str:
        """Copies (or downloads) the checkpoint into ``path`` (a new temporary
        directory when None), rank 0's files on top; returns the directory."""
        src = self._local()
        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="nestor-checkpoint-")
        os.makedirs(dest, exist_ok=True)
        shards = self._shards(src)
        # Rank 0 last, so its files win where names clash (a worker's own rank above it).
        for part in self._siblings() or (list(reversed(shards)) if shards else [src]):
            shutil.copytree(part, dest, dirs_exist_ok=True)
        if src != self.path:
            shutil.rmtree(src, ignore_errors=True)
        return dest

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory holding the checkpoint's files: the directory
        itself where that is possible (a local checkpoint with one shard),
        else a temporary copy removed on exit."""
        src = None if _is_url(self.path) else self._local()
        siblings = self._siblings() if src else []
        if siblings:
            # Every rank's files in one view (a sharded checkpoint needs all
            # of them), linked, not copied: as cheap for a large model.
            tmp = tempfile.mkdtemp(prefix="nestor-checkpoint-")
            try:
                _link_over(siblings, tmp)
                yield tmp
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return
        shards = self._shards(src) if src else []
        if src and not shards:
            yield src
            return
        if src and len(shards) == 1:
            yield shards[0]
            return
        tmp = self.to_directory()
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def get_metadata(self) -> Dict[str, Any]:
        """The checkpoint's metadata (``.metadata.json``; empty when none)."""
        with self.as_directory() as d:
            p = os.path.join(d, _METADATA)
            if not os.path.exists(p):
                return {}
            with open(p) as f:
                return json.load(f)

    def set_metadata(self, metadata: Dict[str, Any]) -> None:
        """Replaces the metadata of a local checkpoint not yet reported."""
        if _is_url(self.path):
            raise ValueError("set_metadata works on a local checkpoint before it is reported")
        with open(os.path.join(self.path, _METADATA), "w") as f:
            json.dump(metadata, f)

    def update_metadata(self, metadata: Dict[str, Any]) -> None:
        """Merges ``metadata`` into a local checkpoint's metadata."""
        current = self.get_metadata() if os.path.exists(os.path.join(self.path, _METADATA)) else {}
        current.update(metadata)
        self.set_metadata(current)


def _link_over(parts: List[str], dest: str) -> None:
    """Lays the files of each directory of ``parts`` over ``dest`` as
    symbolic links, later parts over earlier ones."""
    for part in parts:
        for dirpath, dirs, files in os.walk(part):
            rel = os.path.relpath(dirpath, part)
            here = os.path.normpath(os.path.join(dest, rel))
            os.makedirs(here, exist_ok=True)
            for name in files:
                target = os.path.join(here, name)
                if os.path.lexists(target):
                    os.unlink(target)
                os.symlink(os.path.join(dirpath, name), target)
