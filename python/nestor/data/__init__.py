"""Ray Data's entry points for nestor (``ray.data``): a data set declared in
the script, passed as ``TorchTrainer(datasets={"train": ds})``, and read by
each worker as its share (``nestor.train.get_dataset_shard("train")``).

A ``Dataset`` is a lazy description: files (``read_parquet``, ``read_csv``,
``read_json``) or in-memory data (``from_pandas``, ``from_numpy``,
``from_items``, ``from_huggingface``, written once as Parquet when the run
starts), plus
``map_batches`` functions run in the worker and ``random_shuffle()``. The
driver checks the files and counts their rows once; every rank then reads
only its share of each epoch (see ``nestor.data._split``), through Arrow.

``random_shuffle()`` is cheaper than Ray's global shuffle: each epoch the
blocks (Parquet row groups, or whole CSV/JSON files) come in a new seeded
order and the rows of each block in a new seeded order.
"""

import glob
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ._blocks import _apply, _Block, _filesystem, _is_url, _open, _pa, _Plan, _read_block, _select
from ._iterator import DataIterator

__all__ = ["DataConfig", "DataIterator", "Dataset", "from_huggingface", "from_items", "from_numpy", "from_pandas", "read_csv",
           "read_json", "read_parquet"]


class Dataset:
    """A lazy data set: where its rows come from and what is done to them."""

    def __init__(self, source: Dict[str, Any], transforms: Optional[List[Any]] = None, shuffle: bool = False,
                 seed: Optional[int] = None):
        self._source = source
        self._transforms = list(transforms or [])
        self._shuffle = shuffle
        self._seed = seed
        #: Row selections applied in order when planned (``limit``, ``train_test_split``).
        self._selects: List[Any] = []

    def _with(self, **changes: Any) -> "Dataset":
        d = Dataset(self._source, self._transforms, self._shuffle, self._seed)
        d._selects = list(self._selects)
        for k, v in changes.items():
            setattr(d, k, v)
        return d

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"nestor.data.Dataset has no {name}() (Ray Data's): nestor's data sets have map_batches, "
                             "random_shuffle, train_test_split, limit, repartition, count, schema and take; read the "
                             "files in the shape the workers need, or transform each batch with map_batches")

    def limit(self, n: int) -> "Dataset":
        """The first ``n`` rows (in the files' order)."""
        if n < 0:
            raise ValueError(f"limit({n}): give a number of rows >= 0")
        return self._with(_selects=self._selects + [("limit", int(n))])

    def train_test_split(self, test_size: Union[int, float], *, shuffle: bool = False, seed: Optional[int] = None,
                         **_ignored: Any) -> Tuple["Dataset", "Dataset"]:
        """Two data sets: the rows but ``test_size`` (a fraction, or a
        number of rows), and those. As in Ray, the test rows are the last
        ones; with ``shuffle=True``, ``test_size`` rows drawn at random
        (seeded: the same split on every run with a seed). Either keeps its
        rows in the files' order. Counted when the run starts."""
        if isinstance(test_size, float) and not 0 < test_size < 1:
            raise ValueError(f"train_test_split(test_size={test_size}): a fraction is between 0 and 1")
        if isinstance(test_size, int) and test_size < 0:
            raise ValueError(f"train_test_split(test_size={test_size}): give a number of rows >= 0")
        split = ("split", test_size, bool(shuffle), seed)
        return self._with(_selects=self._selects + [split + (0,)]), self._with(_selects=self._selects + [split + (1,)])

    def repartition(self, num_blocks: Optional[int] = None, **_ignored: Any) -> "Dataset":
        """The same data set: nestor's blocks are the files' row groups (or
        whole files), split across the ranks row by row, whatever their number."""
        return self

    def map_batches(self, fn: Callable[..., Any], *, batch_format: str = "numpy", fn_kwargs: Optional[Dict[str, Any]] = None,
                    **_ignored: Any) -> "Dataset":
        """``fn`` run in the worker on each batch read (a dict of NumPy
        arrays, a pandas DataFrame or a pyarrow Table, as ``batch_format``
        says); it returns the batch's new form, in any of the three."""
        if not callable(fn):
            raise TypeError(f"map_batches: fn must be a function, not {type(fn).__name__}")
        if batch_format not in ("numpy", "pandas", "pyarrow", "default"):
            raise ValueError(f"map_batches(batch_format={batch_format!r}): give 'numpy', 'pandas' or 'pyarrow'")
        return self._with(_transforms=self._transforms + [(fn, "numpy" if batch_format == "default" else batch_format,
                                                           dict(fn_kwargs or {}))])

    def random_shuffle(self, *, seed: Optional[int] = None, **_ignored: Any) -> "Dataset":
        """A new order each epoch: blocks in a seeded order, rows within each
        block too (the same seed gives the same orders everywhere)."""
        return self._with(_shuffle=True, _seed=seed)

    def count(self) -> int:
        """The number of rows (from the files' metadata for Parquet)."""
        return self._plan("count", None).rows

    def schema(self) -> Any:
        """The Arrow schema of the rows read (before ``map_batches``)."""
        blocks = self._plan("schema", None).blocks
        if not blocks:
            return None
        return _read_block(blocks[0]).schema

    def take(self, n: int = 20) -> List[Dict[str, Any]]:
        """The first ``n`` rows, as dicts (read in the driver)."""
        plan = self._plan("take", None)
        out: List[Dict[str, Any]] = []
        for block in plan.blocks:
            out += _apply(_read_block(block), plan.transforms).slice(0, n - len(out)).to_pylist()
            if len(out) >= n:
                break
        return out

    def _plan(self, name: str, storage: Optional[str]) -> _Plan:
        """Checks the files and counts their rows (the driver, once)."""
        src = self._source
        if src["kind"] == "files":
            paths = src["paths"]
        else:
            paths = [_materialise(src, name, storage)]
        blocks = _blocks(paths, src.get("format", "parquet"), name)
        for select in self._selects:
            blocks = _selected(blocks, select, name)
        seed = self._seed if self._seed is not None else 0
        return _Plan(name=name, blocks=blocks, transforms=self._transforms, shuffle=self._shuffle, seed=seed)

    def __repr__(self) -> str:
        src = self._source
        what = ", ".join(src["paths"]) if src["kind"] == "files" else src["kind"]
        return f"Dataset({what}{', shuffled' if self._shuffle else ''}{f', {len(self._transforms)} map_batches' if self._transforms else ''})"


def _selected(blocks: List[_Block], select: Tuple[Any, ...], name: str) -> List[_Block]:
    """The blocks cut by one selection (``limit`` or one side of ``train_test_split``)."""
    total = sum(b.rows for b in blocks)
    if select[0] == "limit":
        return _select(blocks, range(0, min(select[1], total)))
    _, size, shuffle, seed, side = select
    test = int(total * size) if isinstance(size, float) else int(size)
    if test > total:
        raise ValueError(f"datasets.{name}: train_test_split(test_size={size}) asks for more rows than the {total} there are")
    if not shuffle:
        return _select(blocks, range(0, total - test) if side == 0 else range(total - test, total))
    import numpy as np

    from ._split import permutation

    # A stream of its own (not an epoch's): the same split on every run with the seed.
    order = permutation(total, seed if seed is not None else 0, 0, (1 << 64) - 2)
    picked = order[:test] if side == 1 else order[test:]
    return _select(blocks, np.sort(picked))


def _files(paths: Union[str, Sequence[str]], fmt: str) -> Dict[str, Any]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    return {"kind": "files", "paths": [p if _is_url(p) else os.path.abspath(p) for p in paths], "format": fmt}


def read_parquet(paths: Union[str, Sequence[str]], **_ignored: Any) -> Dataset:
    """Parquet files: a file, a directory (its ``*.parquet`` files) or a
    glob, or a list of them; local, or in an object store (``s3://``,
    ``gs://``; the credentials and endpoint from the environment, as for
    checkpoints)."""
    return Dataset(_files(paths, "parquet"))


def read_csv(paths: Union[str, Sequence[str]], **_ignored: Any) -> Dataset:
    """CSV files with a header row: a file, a directory or a glob, or a list."""
    return Dataset(_files(paths, "csv"))


def read_json(paths: Union[str, Sequence[str]], **_ignored: Any) -> Dataset:
    """Newline-delimited JSON files: a file, a directory or a glob, or a list."""
    return Dataset(_files(paths, "json"))


def from_pandas(dfs: Any) -> Dataset:
    """One pandas DataFrame, or a list of them with the same columns."""
    frames = dfs if isinstance(dfs, list) else [dfs]
    return Dataset({"kind": "pandas", "data": frames})


def from_numpy(arrays: Any) -> Dataset:
    """A NumPy array (one column, ``data``), or a dict of column -> array."""
    return Dataset({"kind": "numpy", "data": arrays})


def from_items(items: List[Any]) -> Dataset:
    """A list of dicts (one per row), or of values (one column, ``item``)."""
    return Dataset({"kind": "items", "data": list(items)})


def from_huggingface(dataset: Any) -> Dataset:
    """A Hugging Face ``datasets.Dataset`` (one split; its rows as they
    are, after any ``select``/``shuffle``), written once as Parquet."""
    kind = type(dataset).__name__
    if kind == "DatasetDict" or isinstance(dataset, dict):
        raise ValueError(f"from_huggingface: give one split (dataset['train']), not a DatasetDict of {', '.join(dataset)}")
    if kind == "IterableDataset" or not hasattr(dataset, "with_format"):
        raise ValueError(f"from_huggingface takes a datasets.Dataset, not {kind} (a streamed one: "
                         "write it to Parquet and use read_parquet)")
    return Dataset({"kind": "arrow", "data": dataset.with_format("arrow")[:]})


def _materialise(src: Dict[str, Any], name: str, storage: Optional[str]) -> str:
    """In-memory data as one Parquet file: written once into ``storage``
    (the experiment's directory), read from there by every rank."""
    pa = _pa()
    import pyarrow.parquet as pq

    kind, data = src["kind"], src["data"]
    if kind == "arrow":
        table = data
    elif kind == "pandas":
        table = pa.concat_tables([pa.Table.from_pandas(df, preserve_index=False) for df in data])
    elif kind == "numpy":
        table = pa.table(dict(data) if isinstance(data, dict) else {"data": list(data) if getattr(data, "ndim", 1) > 1 else data})
    else:
        rows = data if all(isinstance(r, dict) for r in data) else [{"item": r} for r in data]
        table = pa.Table.from_pylist(rows)
    if storage is None:
        import tempfile

        storage = tempfile.mkdtemp(prefix="nestor-data-")
    os.makedirs(storage, exist_ok=True)
    path = os.path.join(storage, f"{name}.parquet")
    tmp = path + ".tmp"
    pq.write_table(table, tmp, row_group_size=max(1024, min(65536, table.num_rows // 64 + 1)))
    os.replace(tmp, path)
    return path


_SUFFIXES = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "json": (".json", ".jsonl")}


def _expand_url(url: str, fmt: str, name: str) -> List[str]:
    """The files an object-store URL names: one object, every object of the
    format below a prefix, or those a glob matches."""
    import fnmatch

    from pyarrow import fs

    scheme = url.split("://", 1)[0]
    filesystem, path = _filesystem(url)
    pattern = path if any(c in path for c in "*?[") else None
    base = path.split("*", 1)[0].rsplit("/", 1)[0] if pattern else path.rstrip("/")
    if pattern is None and not path.endswith("/"):
        try:
            if filesystem.get_file_info(path).type == fs.FileType.File:
                return [url]
        except OSError:
            pass  # not an object (some stores refuse to describe a prefix): list it
    try:
        found = filesystem.get_file_info(fs.FileSelector(base, recursive=pattern is not None, allow_not_found=True))
    except OSError as e:
        raise ValueError(f"datasets.{name}: cannot list {url}: {e}") from None
    files = sorted(f.path for f in found if f.type == fs.FileType.File)
    if pattern:
        files = [f for f in files if fnmatch.fnmatch(f, pattern)]
    else:
        files = [f for f in files if f.endswith(_SUFFIXES[fmt]) and not f.rsplit("/", 1)[-1].startswith(".")]
    if not files:
        raise ValueError(f"datasets.{name}: {url} does not exist, or holds no {fmt} file")
    return [f"{scheme}://{f}" for f in files]


def _expand(path: str, fmt: str, name: str) -> List[str]:
    if _is_url(path):
        return _expand_url(path, fmt, name)
    if any(c in path for c in "*?["):
        found = sorted(glob.glob(path))
        if not found:
            raise ValueError(f"datasets.{name}: no file matches {path}")
        return found
    if os.path.isdir(path):
        found = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(_SUFFIXES[fmt]) and not n.startswith("."))
        if not found:
            raise ValueError(f"datasets.{name}: directory {path} holds no {fmt} file")
        return found
    if not os.path.exists(path):
        raise ValueError(f"datasets.{name}: {path} does not exist")
    return [path]


def _blocks(paths: Sequence[str], fmt: str, name: str) -> List[_Block]:
    pa = _pa()
    blocks: List[_Block] = []
    schema, first = None, None
    for path in [f for p in paths for f in _expand(p, fmt, name)]:
        try:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                meta = pq.ParquetFile(_open(path))
                file_schema = meta.schema_arrow
                blocks += [_Block(path, fmt, meta.metadata.row_group(i).num_rows, i) for i in range(meta.num_row_groups)]
            else:
                table = _read_block(_Block(path, fmt, 0))
                file_schema = table.schema
                blocks.append(_Block(path, fmt, table.num_rows))
        except (OSError, pa.ArrowException) as e:
            raise ValueError(f"datasets.{name}: cannot read {path} as {fmt}: {e}") from None
        if schema is None:
            schema, first = file_schema, path
        elif not file_schema.equals(schema):
            raise ValueError(f"datasets.{name}: {path} has columns {_columns(file_schema)}, unlike {first} ({_columns(schema)})")
    return blocks


def _columns(schema: Any) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


@dataclass
class DataConfig:
    """Which data sets are split across the workers (``datasets_to_split``:
    ``"all"`` or a list of names); the others are read whole by every worker."""

    datasets_to_split: Union[str, List[str]] = "all"
    execution_options: Any = None
    enable_shard_locality: bool = True

    def _splits(self, name: str) -> bool:
        return self.datasets_to_split == "all" or name in (self.datasets_to_split or [])

