"""Benchmark: 200 trials that each sleep 0.2 s and report once, 16 at a
time, through the Python driver (``nestor.tune.Tuner``): function
trainables, or (``--kind class``) ``tune.Trainable`` classes whose one
``step`` sleeps; or (``--kind toml``) as a TOML sweep whose ``command``
runs a Python script (``nestor run sweep.toml``; ``--kind toml-cold``: the
same with ``warm = false``, a fresh interpreter per trial). Times the whole
process (interpreter start, imports, the sweep, reading the results) as a
user's ``python sweep.py`` or ``nestor run sweep.toml`` would take; the
ideal is 13 rounds of 0.2 s (2.6 s; 2.5 s counting 12.5 rounds).

    python python/benches/many_trials.py [--kind function|class|toml|toml-cold] [--trials 200] [--sleep 0.2] [--concurrency 16] [--reps 3]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SWEEP = r'''
import sys, time
from nestor import tune

def function(config):
    time.sleep(SLEEP)
    tune.report({"score": config["x"]})


class Class(tune.Trainable):
    def setup(self, config):
        self.x = config["x"]

    def step(self):
        time.sleep(SLEEP)
        return {"score": self.x, "done": True}


trainable = KIND

grid = tune.Tuner(
    # 16 at a time on a 2-core machine: a tenth of a CPU each (as Ray needs
    # num_cpus or with_resources for the same).
    tune.with_resources(trainable, {"cpu": 0.1}),
    param_space={"x": tune.uniform(0, 1)},
    tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=TRIALS, max_concurrent_trials=CONC),
    run_config=tune.RunConfig(name="bench", storage_path=STORAGE),
).fit()
assert len(grid) == TRIALS and grid.num_errors == 0, grid
print("best", grid.get_best_result().metrics["score"], file=sys.stderr)
'''

TOML = '''
[experiment]
name = "bench"
metric = "score"
mode = "max"
num_samples = TRIALS
max_concurrent_trials = CONC

[space]
x = { uniform = [0, 1] }

[trainer]
command = [PYTHON, "trial.py"]
resources_per_worker = { CPU = 0.1 }
WARM
'''

TRIAL = '''
import time

import nestor

config = nestor.get_config()
time.sleep(SLEEP)
nestor.report({"score": config["x"]})
'''


def files(kind: str, args: argparse.Namespace, d: str) -> list:
    """Writes the sweep into ``d``; the command that runs it."""
    fill = lambda text: (text.replace("SLEEP", repr(args.sleep)).replace("TRIALS", str(args.trials))  # noqa: E731
                         .replace("CONC", str(args.concurrency)).replace("STORAGE", repr(os.path.join(d, "runs"))))
    if kind.startswith("toml"):
        from nestor import _binary

        with open(os.path.join(d, "sweep.toml"), "w") as f:
            f.write(fill(TOML).replace("PYTHON", json.dumps(sys.executable))
                    .replace("WARM", "warm = false" if kind == "toml-cold" else ""))
        with open(os.path.join(d, "trial.py"), "w") as f:
            f.write(fill(TRIAL))
        return [_binary.find(), "run", "sweep.toml", "--storage", "runs", "--plain"]
    script = os.path.join(d, "sweep.py")
    with open(script, "w") as f:
        f.write(fill(SWEEP).replace("KIND", kind.capitalize() if kind == "class" else "function"))
    return [sys.executable, script]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["function", "class", "toml", "toml-cold"], default="function")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--sleep", type=float, default=0.2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    rounds = -(-args.trials // args.concurrency)
    print(f"{args.trials} {args.kind} trials x {args.sleep} s, {args.concurrency} at a time; ideal {rounds * args.sleep:.2f} s "
          f"({rounds} rounds)")
    times = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory() as d:
            cmd = files(args.kind, args, d)
            start = time.perf_counter()
            out = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=d)
            took = time.perf_counter() - start
            if out.returncode != 0:
                sys.exit(f"the sweep failed:\n{out.stderr[-3000:]}")
            times.append(took)
            print(f"  run {rep + 1}: {took:.2f} s whole process")
    times.sort()
    print(f"median {times[len(times) // 2]:.2f} s, best {times[0]:.2f} s, ideal {rounds * args.sleep:.2f} s")


if __name__ == "__main__":
    main()
