"""Time from `nestor run` to the 2-worker DDP trial's first report, against
the same two ranks started by hand with the same environment (torchrun's
variables, no nestor): the cost nestor adds to a trial's start.

    VENV=$(examples/torch_ddp/venv.sh)
    cargo build --release --workspace
    "$VENV/bin/python" examples/torch_ddp/bench_first_report.py [--reps 5]

Every run trains one epoch of examples/torch_ddp/train.py; "first report" is
the moment both ranks are about to make their first report (train.py prints
it), so the same work is timed on every side. A third run starts the ranks
by hand with nestor's file rendezvous (a run plan, `NESTOR_RUN`, naming it), to tell
what nestor's rendezvous saves from what its driver costs. A fourth runs the
same training function as a `TorchTrainer` from the Python driver
(`python -c ...`: the interpreter, the driver's imports, then the fit);
`NESTOR_WARM_FORK=0` in the bench's environment times that side with the
warm process started by the binary rather than forked from the driver.
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CONFIG = {"lr": 0.01, "hidden": 32, "batch_size": 64, "epochs": 1, "seed": 0}
FIRST = re.compile(r"rank (\d+): first report at ([0-9.]+)")


def first_reports(text):
    return {int(m.group(1)): float(m.group(2)) for m in FIRST.finditer(text)}


def with_nestor(storage, i):
    sets = ["experiment.num_samples=1", f"experiment.name=bench-{i}", "space.epochs=1", "stop.training_iteration=1"]
    for k, v in CONFIG.items():
        if k != "epochs":
            sets.append(f"space.{k}={v}")
    args = [os.path.join(REPO, "target/release/nestor"), "run", "examples/torch_ddp/sweep.toml", "--storage", storage, "--plain"]
    for s in sets:
        args += ["--set", s]
    # The sweep's `python` is this environment's.
    env = dict(os.environ, PATH=os.pathsep.join((os.path.dirname(sys.executable), os.environ.get("PATH", ""))))
    t0 = time.time()
    subprocess.run(args, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    logs = os.path.join(storage, f"bench-{i}", "trials", "trial_00000", "logs")
    times = {}
    for r in (0, 1):
        with open(os.path.join(logs, f"rank-{r}.log")) as f:
            times.update(first_reports(f.read()))
    return max(times.values()) - t0


# The same training function from the Python driver: a TorchTrainer of 2
# workers, its ranks forked from the driver's process (which imported
# train.py, and torch with it, once).
DRIVER = """
import train
from nestor.train import RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer

TorchTrainer(train.main, train_loop_config={config!r}, scaling_config=ScalingConfig(num_workers=2),
             run_config=RunConfig(name={name!r}, storage_path={storage!r})).fit()
"""


def with_python_driver(storage, i):
    code = DRIVER.format(config=CONFIG, name=f"bench-py-{i}", storage=storage)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p),
               NESTOR_BIN=os.environ.get("NESTOR_BIN") or os.path.join(REPO, "target/release/nestor"))
    t0 = time.time()
    # The ranks' lines reach the driver's console (standard error), each behind its rank.
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True).stderr
    times = first_reports(out)
    if len(times) != 2:
        raise SystemExit(f"the Python driver's ranks did not both report:\n{out[-2000:]}")
    return max(times.values()) - t0


def by_hand(rendezvous=None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith("NESTOR_")}
    t0 = time.time()
    procs = []
    for rank in (0, 1):
        env = dict(base, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", NODE_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
                   # A plan without a driver: the config, and where the ranks meet.
                   NESTOR_RUN=json.dumps({"version": 2, "trial": {"id": "by-hand", "dir": REPO, "config": CONFIG},
                                          "routes": {"meet": {"kind": "file", "path": rendezvous} if rendezvous
                                                     else {"kind": "master"}}}))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "train.py")], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    times = {}
    for p in procs:
        out, err = p.communicate()
        times.update(first_reports(out))
        if p.returncode != 0:
            raise SystemExit(f"a rank started by hand failed with code {p.returncode}:\n{err[-2000:]}")
    return max(times.values()) - t0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    reps = parser.parse_args().reps
    nestor_times, python_times, hand_times, file_times = [], [], [], []
    with tempfile.TemporaryDirectory() as storage:
        for i in range(reps):
            # Interleaved, so drift on the machine hits all alike.
            hand_times.append(by_hand())
            nestor_times.append(with_nestor(storage, i))
            python_times.append(with_python_driver(storage, i))
            file_times.append(by_hand(os.path.join(storage, f"rendezvous-{i}")))
    hand, nestor, python, file = (statistics.median(t) for t in (hand_times, nestor_times, python_times, file_times))
    show = lambda ts: ", ".join(f"{t:.2f}" for t in ts)
    print(f"first report of a 2-worker DDP trial (median of {reps}):")
    print(f"  two ranks started by hand (env:// rendezvous):  {hand:.3f} s   ({show(hand_times)})")
    print(f"  nestor run sweep.toml:                          {nestor:.3f} s   ({show(nestor_times)})")
    print(f"  TorchTrainer.fit() from Python:                 {python:.3f} s   ({show(python_times)})")
    print(f"  by hand, with nestor's file rendezvous:         {file:.3f} s   ({show(file_times)})")
    for side, t in (("nestor run", nestor), ("the Python driver", python)):
        print(f"  {side} against the ranks by hand: {t - hand:+.3f} s ({(t / hand - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
