"""Benchmark: what a Python ``tune.Callback`` costs the sweep. 16 function
trials report 2,000 results each as fast as they can, 16 at a time, through
the Python driver, with no callback and then with a ``tune.Callback`` whose
``on_trial_result`` counts the results (run in the script's process, fed
by the binary). Prints results per second of the whole process (from
``python sweep.py`` to its exit, with the callback's last events taken)
for each, and the callback's share.

    python python/benches/callback_overhead.py [--trials 16] [--reports 2000] [--reps 3]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

SWEEP = r'''
import sys
from nestor import tune


def trainable(config):
    for i in range(REPORTS):
        tune.report({"score": config["x"] + i})


class Count(tune.Callback):
    def __init__(self):
        self.n = 0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.n += 1


count = Count()
grid = tune.Tuner(
    tune.with_resources(trainable, {"cpu": 0.1}),
    param_space={"x": tune.uniform(0, 1)},
    tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=TRIALS, max_concurrent_trials=TRIALS),
    run_config=tune.RunConfig(name="bench", storage_path=STORAGE, callbacks=[count] if CALLBACK else None),
).fit()
assert len(grid) == TRIALS and grid.num_errors == 0, grid
if CALLBACK:
    assert count.n == TRIALS * REPORTS, count.n
'''


def run(args: argparse.Namespace, callback: bool) -> float:
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "sweep.py")
        with open(script, "w") as f:
            f.write(SWEEP.replace("REPORTS", str(args.reports)).replace("TRIALS", str(args.trials))
                    .replace("CALLBACK", str(callback)).replace("STORAGE", repr(os.path.join(d, "runs"))))
        start = time.perf_counter()
        out = subprocess.run([sys.executable, script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        took = time.perf_counter() - start
        if out.returncode != 0:
            sys.exit(f"the sweep failed:\n{out.stderr[-3000:]}")
        return args.trials * args.reports / took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--reports", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.trials} trials x {args.reports} reports, all at once")
    rates = {False: [], True: []}
    for rep in range(args.reps):
        for callback in (False, True):
            rate = run(args, callback)
            rates[callback].append(rate)
            print(f"  run {rep + 1} {'with' if callback else 'without'} a Python callback: {rate:,.0f} results/s")
    med = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    print(f"median without {med[False]:,.0f} results/s, with {med[True]:,.0f} results/s "
          f"({100 * (med[True] / med[False] - 1):+.1f}%)")


if __name__ == "__main__":
    main()
