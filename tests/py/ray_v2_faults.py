"""Ray Train V2's Tune pattern under faults. In one trial a trainer's rank
dies once: the trainer's FailureConfig restarts its ranks from their latest
checkpoint. In the other the trial's function fails once after its
trainer's third result: Tune's FailureConfig restarts the trial, and its
trainer goes on from its latest committed checkpoint. Each trial's function
writes what its last fit() saw to LOGDIR/<fault>.json.

Usage: ray_v2_faults.py STORAGE LOGDIR
"""

import json
import os
import sys
import tempfile

from nestor import train, tune
from nestor.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer
from nestor.tune.integration.ray_train import TuneReportCallback

storage, logdir = sys.argv[1], sys.argv[2]


def train_fn_per_worker(config):
    ctx = train.get_context()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "step.json")) as f:
                start = json.load(f)["step"]
    marker = os.path.join(config["logdir"], "rank-died")
    for step in range(start + 1, 7):
        if config["fault"] == "rank" and step == 4 and ctx.get_world_rank() == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step.json"), "w") as f:
                json.dump({"step": step}, f)
            train.report({"step": float(step), "start": float(start)}, checkpoint=Checkpoint.from_directory(d))


class Seen(TuneReportCallback):
    """Reports to the trial, notes each step; the trial's function fails once at step 3."""

    def __init__(self, config):
        super().__init__()
        self.config, self.steps = config, []

    def after_report(self, run_context, metrics, checkpoint):
        super().after_report(run_context, metrics, checkpoint)
        self.steps.append(int(metrics[0]["step"]))
        marker = os.path.join(self.config["logdir"], "trial-failed")
        if self.config["fault"] == "trial" and self.steps[-1] == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("the trial's function fails once")


def train_driver_fn(config):
    seen = Seen(config)
    result = TorchTrainer(
        train_fn_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(callbacks=[seen], failure_config=FailureConfig(max_failures=1),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    ).fit()
    with open(os.path.join(config["logdir"], f"{config['fault']}.json"), "w") as f:
        json.dump({"steps": seen.steps, "restarts": result.restarts, "checkpoint": result.checkpoint.path,
                   "path": result.path, "last": result.metrics.get("step")}, f)


grid = tune.Tuner(
    train_driver_fn,
    param_space={"fault": tune.grid_search(["rank", "trial"]), "logdir": logdir},
    tune_config=tune.TuneConfig(metric="step", mode="max"),
    run_config=tune.RunConfig(name="faults", storage_path=storage, failure_config=tune.FailureConfig(max_failures=1)),
).fit()
print("TRIALS", json.dumps({r.config["fault"]: {"status": r.status, "error": str(r.error) if r.error else None,
                                                "id": r.trial_id, "last": r.metrics.get("step")} for r in grid}))
