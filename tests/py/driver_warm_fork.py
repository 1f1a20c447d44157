"""The driver forked as the sweep's warm process: its ranks are its
grandchildren, yet each starts as a fresh rank would (nestor's state of the
driver, which ran the function locally first, is not theirs; no atexit
handler of the driver runs in them), the sweep's Python callbacks still see
every result, and no process of the sweep outlives fit(). MODE ``thread``
starts a thread first: a process with a thread of its own is not forked, and
the binary starts the warm process. A module on the PYTHONPATH the driver
set after it started imports in every rank either way. Usage: driver_warm_fork.py STORAGE fork|thread"""

import atexit
import os
import sys
import threading
import time

import warm_helper  # counted: the driver's import serves its fork too; the binary's warm process imports it again
from nestor import tune

STORAGE, MODE = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(os.path.join(STORAGE, f"atexit-{os.getpid()}"), "w").close())


def parent_of(pid):
    """A process's parent; None for one that is gone (listed a moment ago)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def trainable(config):
    late = 0
    if config["i"] >= 0:  # in a rank: the driver never imports it, its fork has it only through sys.path
        import late_module

        late = late_module.VALUE
    tune.report({"i": config["i"], "grandparent": parent_of(os.getppid()), "pid": os.getpid(), "state": len(warm_helper.STATE),
                 "late": late})


class Count(tune.Callback):
    def __init__(self):
        self.n = 0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.n += 1


late = os.path.join(STORAGE, "late")
os.makedirs(late)
with open(os.path.join(late, "late_module.py"), "w") as f:
    f.write("VALUE = 7\n")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (late, os.environ.get("PYTHONPATH")) if p)
trainable({"i": -1})  # locally, before the sweep: nestor's context of this process is a local one
if MODE == "thread":
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
count = Count()
grid = tune.Tuner(
    trainable,
    param_space={"i": tune.grid_search(list(range(4)))},
    run_config=tune.RunConfig(name=f"fork-{MODE}", storage_path=STORAGE, callbacks=[count]),
).fit()
rows = [r.metrics for r in grid]
assert grid.num_errors == 0, grid.errors
print("DRIVER", os.getpid())
print("RESULTS", len(rows))
print("CALLBACK", count.n)
print("LATE", sum(r["late"] == 7 for r in rows))
print("FORKED", sum(r["grandparent"] == os.getpid() for r in rows))
print("CHILDREN", sum(1 for p in os.listdir("/proc") if p.isdigit() and parent_of(p) == os.getpid()))
