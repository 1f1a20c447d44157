"""Benchmark: 200 trials that each sleep 0.2 s and report once, 16 at a
time, through the Python driver (``nestor.tune.Tuner``): function
trainables, or (``--kind class``) ``tune.Trainable`` classes whose one
``step`` sleeps. Times the whole process (interpreter start, imports, the
sweep, reading the results) as a user's ``python sweep.py`` would take; the
ideal is 13 rounds of 0.2 s (2.6 s; 2.5 s counting 12.5 rounds).

    python python/benches/many_trials.py [--kind function|class] [--trials 200] [--sleep 0.2] [--concurrency 16] [--reps 3]
"""

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["function", "class"], default="function")
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
            script = os.path.join(d, "sweep.py")
            with open(script, "w") as f:
                f.write(SWEEP.replace("SLEEP", repr(args.sleep)).replace("TRIALS", str(args.trials))
                        .replace("CONC", str(args.concurrency)).replace("KIND", args.kind.capitalize() if args.kind == "class" else "function").replace("STORAGE", repr(os.path.join(d, "runs"))))
            start = time.perf_counter()
            out = subprocess.run([sys.executable, script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            took = time.perf_counter() - start
            if out.returncode != 0:
                sys.exit(f"the sweep failed:\n{out.stderr[-3000:]}")
            times.append(took)
            print(f"  run {rep + 1}: {took:.2f} s whole process")
    times.sort()
    print(f"median {times[len(times) // 2]:.2f} s, best {times[0]:.2f} s, ideal {rounds * args.sleep:.2f} s")


if __name__ == "__main__":
    main()
