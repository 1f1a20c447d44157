"""nestor.data's reading speed and memory, on one Parquet file.

    VENV=$(examples/torch_ddp/venv.sh)
    "$VENV/bin/python" python/benches/data.py [--rows 2000000] [--reps 3] [--ray-python PY]

- rows per second delivered to one rank as NumPy batches of 1,024
  (``get_dataset_shard(...).iter_batches``), against plain
  ``pyarrow.parquet.ParquetFile.iter_batches`` turned into the same NumPy
  dicts, and as torch batches against Ray Data's ``iter_torch_batches`` on
  the same file (``--ray-python``: a Python with ``ray[data]``);
- the memory a rank holds reading its share (rank 0 of 10) of the file:
  Arrow's peak allocation, and how much an epoch grows the process,
  against the file's size in memory.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
BATCH = 1024


def make(path, rows):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    cols = {f"f{i}": rng.standard_normal(rows, dtype=np.float32) for i in range(8)}
    cols["label"] = rng.integers(0, 10, rows)
    pq.write_table(pa.table(cols), path, row_group_size=65536)


def nestor_iterator(path, world=1, rank=0):
    from nestor import data
    from nestor.data import DataIterator

    plan = data.read_parquet(path)._plan("bench", None)
    return DataIterator(plan, rank, world)


def run(side, path):
    """One timed pass in this process; returns (rows, seconds)."""
    if "torch" in side:
        import torch  # noqa: F401  (its import is not the reading)
    t0 = time.perf_counter()
    rows = 0
    if side == "nestor-numpy":
        for b in nestor_iterator(path).iter_batches(batch_size=BATCH):
            rows += len(b["label"])
    elif side == "pyarrow-numpy":
        import pyarrow.parquet as pq

        for rb in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
            b = {name: rb.column(i).to_numpy() for i, name in enumerate(rb.schema.names)}
            rows += len(b["label"])
    elif side == "nestor-torch":
        for b in nestor_iterator(path).iter_torch_batches(batch_size=BATCH, device="cpu"):
            rows += len(b["label"])
    elif side == "ray-torch":
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        ds = ray.data.read_parquet(path)
        t0 = time.perf_counter()  # Ray's start is not the reading
        for b in ds.iter_torch_batches(batch_size=BATCH):
            rows += len(b["label"])
    elif side == "memory":
        import pyarrow as pa

        it = nestor_iterator(path, world=10, rank=0)
        for b in it.iter_batches(batch_size=BATCH):  # the first epoch loads what stays (libraries, the thread)
            pass
        before = peak = _rss_mb()
        for b in it.iter_batches(batch_size=BATCH):
            rows += len(b["label"])
            peak = max(peak, _rss_mb())
        return rows, [peak - before, pa.default_memory_pool().max_memory() / 1e6]
    return rows, time.perf_counter() - t0


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ray-python")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        print(json.dumps(run(a.side, a.path)))
        return
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.parquet")
        make(path, a.rows)
        size_mb = a.rows * (8 * 4 + 8) / 1e6
        sides = ["nestor-numpy", "pyarrow-numpy", "nestor-torch"] + (["ray-torch"] if a.ray_python else [])
        rates = {s: [] for s in sides}
        for _ in range(a.reps):
            for side in sides:  # each in a fresh process, interleaved
                python = a.ray_python if side == "ray-torch" else sys.executable
                out = subprocess.run([python, HERE, "--side", side, "--path", path], stdout=subprocess.PIPE, text=True, check=True)
                rows, secs = json.loads(out.stdout.strip().splitlines()[-1])
                assert rows == a.rows, (side, rows)
                rates[side].append(rows / secs)
        out = subprocess.run([sys.executable, HERE, "--side", "memory", "--path", path], stdout=subprocess.PIPE, text=True, check=True)
        rows, peak = json.loads(out.stdout.strip().splitlines()[-1])
        report = {s: f"{statistics.median(r) / 1e6:.2f} M rows/s ({min(r) / 1e6:.2f}-{max(r) / 1e6:.2f})" for s, r in rates.items()}
        group_mb = 65536 * (8 * 4 + 8) / 1e6
        grew, arrow = peak
        report["memory"] = (f"rank 0 of 10 read {rows} rows an epoch: Arrow held at most {arrow:.1f} MB, and an epoch's "
                            f"reading grew the process by at most {grew:.1f} MB (a row group is {group_mb:.1f} MB; "
                            f"the whole file {size_mb:.0f} MB in memory)")
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
