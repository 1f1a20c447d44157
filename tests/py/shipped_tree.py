"""A worker whose checkpoint is a tree (nested directories, an empty file,
an empty directory, a file of several chunks), shipped to the driver and
fetched back (NESTOR_NODE_VIEW=unshared: the routes of nodes that share no
directory with the driver). The first
run checkpoints steps 1 and 2 and dies at step 3; the restarted run checks
that the tree it resumes from is the one saved at step 2, byte for byte,
and reports it."""

import hashlib
import os
import sys
import tempfile

import nestor


def tree(step: int) -> dict:
    big = bytes((i * 7 + step) % 251 for i in range(600_000))
    return {"model/weights.bin": big, "model/meta/step.txt": str(step).encode(), "empty.txt": b""}


def save(root: str, step: int) -> None:
    for rel, data in tree(step).items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(root, "logs", "none"), exist_ok=True)


def digest(root: str) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        h.update(f"dir {rel}\n".encode())
        for name in sorted(filenames):
            with open(os.path.join(dirpath, name), "rb") as f:
                h.update(f"file {rel}/{name}\n".encode() + f.read())
    return h.hexdigest()


def main() -> None:
    ctx = nestor.get_context()
    ckpt = nestor.get_checkpoint()
    start, same = 0, 0.0
    if ckpt is not None:
        with open(os.path.join(ckpt, "model", "meta", "step.txt")) as f:
            start = int(f.read())
        with tempfile.TemporaryDirectory() as expected:
            save(expected, start)
            same = 1.0 if digest(ckpt) == digest(expected) else 0.0
        print(f"resumed from {ckpt} at step {start}: same tree {same}", flush=True)
    for step in range(start + 1, 5):
        if step == 3 and ckpt is None:
            print("dying on purpose at step 3", flush=True)
            sys.exit(3)
        with tempfile.TemporaryDirectory() as scratch:
            save(scratch, step)
            nestor.report({"loss": 1.0 / step, "restored_same": same, "start": float(start)}, checkpoint=scratch)


if __name__ == "__main__":
    main()
