"""Warm workers: every trial runs in a fresh fork of one warm process. Each
trial checks that nothing of an earlier trial is left (a module global it
mutates, an environment variable it sets, a torch-free import counter) and
reports its pid and its parent's. Usage: driver_warm.py STORAGE"""

import os
import sys

import warm_helper  # imported once, by the warm process (it counts its imports in a file)
from nestor import tune

SEEN = []


def trainable(config):
    leaked = len(SEEN) + len(warm_helper.STATE) + (1 if os.environ.get("LEAK_MARKER") else 0)
    SEEN.append(config["i"])
    warm_helper.STATE.append(config["i"])
    os.environ["LEAK_MARKER"] = "1"
    tune.report({"leaked": leaked, "pid": os.getpid(), "ppid": os.getppid(), "i": config["i"]})


grid = tune.Tuner(
    tune.with_resources(trainable, {"cpu": 0.25}),
    param_space={"i": tune.grid_search(list(range(8)))},
    tune_config=tune.TuneConfig(max_concurrent_trials=4),
    run_config=tune.RunConfig(name="warm", storage_path=sys.argv[1]),
).fit()
rows = [r.metrics for r in grid]
assert len(rows) == 8 and grid.num_errors == 0, grid.errors
print("LEAKED", int(sum(r["leaked"] for r in rows)))
print("PIDS", len({r["pid"] for r in rows}))
print("PPIDS", len({r["ppid"] for r in rows}))
