"""A sweep to kill and restore: 4 trials of 25 steps, a checkpoint every
step; after each acknowledged report a rank appends `trial iteration` to
$ACKS. Usage: driver_crash.py STORAGE run|restore"""

import json
import os
import sys
import tempfile
import time

from nestor import tune


def trainable(config):
    step = 0
    ckpt = tune.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            step = json.load(open(os.path.join(d, "s.json")))["step"]
    ctx = tune.get_context()
    while step < 25:
        step += 1
        time.sleep(0.04)
        with tempfile.TemporaryDirectory() as d:
            json.dump({"step": step}, open(os.path.join(d, "s.json"), "w"))
            tune.report({"score": config["a"] * step}, checkpoint=tune.Checkpoint.from_directory(d))
        with open(os.environ["ACKS"], "a") as f:
            f.write(f"{ctx.get_trial_id()} {step}\n")


path = os.path.join(sys.argv[1], "crash")
trainable_ = tune.with_resources(trainable, {"cpu": 0.5})
if sys.argv[2] == "run":
    tuner = tune.Tuner(trainable_, param_space={"a": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
                       tune_config=tune.TuneConfig(metric="score", mode="max"),
                       run_config=tune.RunConfig(name="crash", storage_path=sys.argv[1]))
else:
    assert tune.Tuner.can_restore(path), path
    tuner = tune.Tuner.restore(path, trainable_)
grid = tuner.fit()
print("RESULT", json.dumps({r.trial_id: [h["training_iteration"] for h in r.metrics_history] for r in grid}))
print("STATUS", json.dumps({r.trial_id: r.status for r in grid}))
