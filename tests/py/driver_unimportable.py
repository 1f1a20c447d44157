"""A training function from a module the workers cannot import (it lives
in a directory only the driver had on sys.path, removed after the sweep
started would be too late: it is removed before the warm process loads the
function). Every trial errors, naming the import that failed, where the
binary starts the warm process (NESTOR_WARM_FORK=0); the driver forked as
the warm process has the module loaded already, and its trials run.
Usage: driver_unimportable.py STORAGE"""

import os
import shutil
import sys
import tempfile

from nestor import tune
from nestor import _driver

d = tempfile.mkdtemp()
with open(os.path.join(d, "only_here.py"), "w") as f:
    f.write("from nestor import tune\n\ndef trainable(config):\n    tune.report({'x': 1.0})\n")
sys.path.insert(0, d)
import only_here  # noqa: E402

real_write = _driver.write_blob


def write_then_remove(exp_dir, payload):
    path = real_write(exp_dir, payload)
    shutil.rmtree(d)  # the module is gone before any worker loads the function
    return path


_driver.write_blob = write_then_remove
grid = tune.Tuner(only_here.trainable, param_space={"a": tune.grid_search([1, 2])},
                  run_config=tune.RunConfig(name="unimportable", storage_path=sys.argv[1])).fit()
print("ERRORS", grid.num_errors)
if grid.errors:
    print(grid.errors[0])
