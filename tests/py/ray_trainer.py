"""A trainer run again: Ray Train's `fit()` of a run whose name and storage
exist goes on from its latest checkpoint; `resume_from_checkpoint=` starts
a new run from a given one.

Usage: ray_trainer.py STORAGE fit|from
  fit   TorchTrainer(name="refit"): 30 slow steps, a checkpoint each; $ACKS gets each acknowledged step
  from  a new run ("from") with resume_from_checkpoint= the refit run's latest checkpoint
"""

import json
import os
import sys
import tempfile
import time

from nestor import train, tune
from nestor.train import RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer


def loop(config):
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read())
    for step in range(start + 1, config["steps"] + 1):
        time.sleep(0.05)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            train.report({"step": step, "start": start}, checkpoint=train.Checkpoint.from_directory(d))
        if os.environ.get("ACKS"):
            with open(os.environ["ACKS"], "a") as f:
                f.write(f"{step}\n")


storage, mode = sys.argv[1], sys.argv[2]
if mode == "fit":
    result = TorchTrainer(loop, train_loop_config={"steps": 30}, scaling_config=ScalingConfig(num_workers=1),
                          run_config=RunConfig(name="refit", storage_path=storage)).fit()
else:
    earlier = tune.ResultGrid(os.path.join(storage, "refit"))[0].checkpoint
    result = TorchTrainer(loop, train_loop_config={"steps": 35}, scaling_config=ScalingConfig(num_workers=1),
                          resume_from_checkpoint=earlier, run_config=RunConfig(name="from", storage_path=storage)).fit()
print("HISTORY", json.dumps([[int(h["training_iteration"]), int(h["step"]), int(h["start"])] for h in result.metrics_history]))
