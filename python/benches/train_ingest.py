"""Ray Train's input pipelines under nestor, against the floor and Ray.

    VENV=$(examples/torch_ddp/venv.sh)
    cargo build --release -p nestor-cli
    B="NESTOR_BIN=target/release/nestor $VENV/bin/python python/benches/train_ingest.py"
    $B ddp [--reps 3] [--ray-python PY]      # a 2-rank DDP epoch, DataLoader(num_workers=4): nestor, torchrun, Ray Train
    $B preprocess [--rows 1000000] [--ray-python PY]   # a preprocessor's fit and transform: nestor.data, Ray Data
    $B echo [--lines 100000]                 # results/s of ranks that print, with the console echo and without

``ddp``: the same training function (a small CNN over an image-shaped data
set of 3x32x32 tensors made in the loader's workers, 4 of them per rank,
persistent, batches of 64) runs one epoch on 2 gloo ranks: under nestor
(``TorchTrainer``), under ``torchrun`` (the same function, the ranks'
variables set by torchrun, nestor's report local) and under Ray Train 2.60
(``--ray-python``: a Python with ``ray[train]``). The figure is the epoch's
time as rank 0 measures it inside the function, from its first batch to
its last step (what the pipeline costs while training), and the whole
command's wall time.

``preprocess``: ``StandardScaler`` on two columns and ``OneHotEncoder`` on
one, fitted then applied to every row of an in-memory table of ``--rows``
rows, read back in full (``materialize``): nestor's (fit on the driver,
the transform batch by batch as a rank would) against Ray Data's.

``echo``: a TOML sweep of 4 trials x 1 rank, each reporting 5,000 results
flat out and printing ``--lines`` / 4 lines between them; results stored
per second with ``log_to_driver`` on (the lines on this console) and off.
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


# ---- ddp ----

IMAGES = 8192


def ddp_loop(config):
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    class Images(Dataset):
        def __len__(self):
            return IMAGES

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return torch.rand(3, 32, 32, generator=g), i % 10

    side = config["side"]
    if side == "ray":
        import ray.train as train
        import ray.train.torch as tt
    else:
        from nestor import train
        import nestor.train.torch as tt
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10))
    model = tt.prepare_model(model)
    loader = tt.prepare_data_loader(DataLoader(Images(), batch_size=64, shuffle=True, num_workers=4, persistent_workers=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start, steps = None, 0
    for x, y in loader:
        if start is None:
            start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    dist.barrier()
    epoch_s = time.perf_counter() - start
    train.report({"epoch_s": epoch_s, "steps": float(steps)})
    if train.get_context().get_world_rank() == 0 and config.get("out"):
        with open(config["out"], "w") as f:
            import threading

            json.dump({"epoch_s": epoch_s, "steps": steps, "threads": torch.get_num_threads(),
                       "interop": torch.get_num_interop_threads(), "py_threads": threading.active_count(),
                       "affinity": len(os.sched_getaffinity(0)), "nice": os.nice(0)}, f)


def ddp_run(side: str, out: str) -> None:
    """One run, in this process (nestor's or Ray's driver)."""
    config = {"side": side, "out": out}
    if side == "ray":
        import ray
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        TorchTrainer(ddp_loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(storage_path=os.path.dirname(out))).fit()
    else:
        from nestor.train import RunConfig, ScalingConfig
        from nestor.train.torch import TorchTrainer

        TorchTrainer(ddp_loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(storage_path=os.path.dirname(out))).fit()


def torchrun_rank() -> None:
    """A rank under torchrun: nestor's helpers with torchrun's variables, no driver."""
    import nestor.torch

    nestor.torch.init_process_group()
    ddp_loop({"side": "torchrun", "out": os.environ["BENCH_OUT"]})


def ddp(a: argparse.Namespace) -> None:
    sides = [("nestor", [sys.executable, HERE, "--ddp-run", "nestor"]), ("torchrun", None)]
    if a.ray_python:
        sides.append(("ray", [a.ray_python, HERE, "--ddp-run", "ray"]))
    got = {s: {"epoch": [], "wall": []} for s, _ in sides}
    for _ in range(a.reps):
        for side, cmd in sides:
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "epoch.json")
                env = dict(os.environ, BENCH_OUT=out)
                if side == "torchrun":
                    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
                    cmd = [torchrun, "--nproc-per-node", "2", HERE, "--torchrun-rank"]
                t = time.perf_counter()
                p = subprocess.run(cmd + ([out] if side != "torchrun" else []), cwd=d, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
                wall = time.perf_counter() - t
                if p.returncode != 0:
                    raise SystemExit(f"{side} failed:\n{p.stderr[-3000:]}")
                with open(out) as f:
                    got[side]["epoch"].append(json.load(f)["epoch_s"])
                got[side]["wall"].append(wall)
    floor = statistics.median(got["torchrun"]["epoch"])
    for side, _ in sides:
        e, w = statistics.median(got[side]["epoch"]), statistics.median(got[side]["wall"])
        print(f"{side:9} epoch {e:6.2f} s ({e / floor:.3f}x torchrun)   whole command {w:6.2f} s   "
              f"[epochs {', '.join(f'{v:.2f}' for v in got[side]['epoch'])}]")


# ---- preprocess ----


def preprocess_run(side: str, rows: int) -> None:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.normal(size=rows), "b": rng.normal(3, 2, size=rows),
                       "c": rng.choice(["x", "y", "z"], size=rows), "d": rng.integers(0, 100, rows)})
    if side == "ray":
        import ray
        import ray.data as rd
        from ray.data.preprocessors import Chain, OneHotEncoder, StandardScaler

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        rd.DataContext.get_current().enable_progress_bars = False
    else:
        import nestor.data as rd
        from nestor.data.preprocessors import Chain, OneHotEncoder, StandardScaler
    ds = rd.from_pandas(df)
    t = time.perf_counter()
    p = Chain(StandardScaler(["a", "b"]), OneHotEncoder(["c"]))
    p.fit(ds)
    fitted = time.perf_counter()
    out = p.transform(ds).materialize()
    n = out.count()
    done = time.perf_counter()
    assert n == rows, n
    print(json.dumps({"fit_s": fitted - t, "transform_s": done - fitted, "rows": n}))


def preprocess(a: argparse.Namespace) -> None:
    sides = [("nestor", sys.executable)] + ([("ray", a.ray_python)] if a.ray_python else [])
    for side, python in sides:
        fits, transforms = [], []
        for _ in range(a.reps):
            p = subprocess.run([python, HERE, "--preprocess-run", side, str(a.rows)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                raise SystemExit(f"{side} failed:\n{p.stderr[-3000:]}")
            got = json.loads(p.stdout.strip().splitlines()[-1])
            fits.append(got["fit_s"])
            transforms.append(got["transform_s"])
        f, t = statistics.median(fits), statistics.median(transforms)
        print(f"{side:7} {a.rows:,} rows: fit {f:6.2f} s, transform {t:6.2f} s, "
              f"{a.rows / (f + t) / 1e6:5.2f} M rows/s in all")


# ---- echo ----

ECHO_WORKER = """
import os, sys, nestor
lines = int(os.environ["ECHO_LINES"])
reports = 5000
every = max(1, reports // max(lines, 1))
per = max(1, lines // reports)
for i in range(reports):
    if lines:
        for j in range(per):
            print(f"step {i} line {j}: some training output of a realistic length, loss=0.123", flush=False)
    nestor.report({"loss": 1.0 / (i + 1)})
sys.stdout.flush()
"""


def echo(a: argparse.Namespace) -> None:
    binary = os.environ.get("NESTOR_BIN", "nestor")
    rates = {}
    for label, on, lines in (("quiet ranks", True, 0), ("echo on", True, a.lines), ("echo off", False, a.lines)):
        vals = []
        for _ in range(a.reps):
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "worker.py"), "w") as f:
                    f.write(ECHO_WORKER)
                with open(os.path.join(d, "sweep.toml"), "w") as f:
                    f.write(f'[experiment]\nname = "echo"\nmetric = "loss"\nmode = "min"\nnum_samples = 4\n'
                            f'log_to_driver = {"true" if on else "false"}\n\n[space]\nx = 1\n\n[trainer]\n'
                            f'command = ["{sys.executable}", "worker.py"]\nenv = {{ ECHO_LINES = "{lines // 4}" }}\n')
                t = time.perf_counter()
                p = subprocess.run([binary, "run", "sweep.toml", "--storage", "runs", "--plain"], cwd=d, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
                took = time.perf_counter() - t
                if p.returncode != 0:
                    raise SystemExit(p.stderr[-3000:])
                shown = p.stderr.count(") step ")
                vals.append(4 * 5000 / took)
        rates[label] = statistics.median(vals)
        print(f"{label:12} {lines:7,} rank lines: {rates[label]:8.0f} results/s (whole sweep; lines shown: {shown:,})")
    print(f"echo on / off: {rates['echo on'] / rates['echo off']:.3f}")


def main() -> None:
    if sys.argv[1:2] == ["--ddp-run"]:
        ddp_run(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1:2] == ["--torchrun-rank"]:
        torchrun_rank()
        return
    if sys.argv[1:2] == ["--preprocess-run"]:
        preprocess_run(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["ddp", "preprocess", "echo"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--ray-python", help="a Python with ray[train,data] 2.60, for Ray's side")
    a = ap.parse_args()
    {"ddp": ddp, "preprocess": preprocess, "echo": echo}[a.what](a)


if __name__ == "__main__":
    main()
