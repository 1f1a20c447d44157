"""Ray Train V2's Tune pattern: a function trainable builds a TorchTrainer
and calls fit(); TuneReportCallback delivers the trainer's results to the
trial, whose scheduler (ASHA) stops the weaker ones.

Usage: ray_v2.py STORAGE
"""

import json
import os
import sys
import time

from nestor import train, tune
from nestor.train import RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer
from nestor.tune.integration.ray_train import TuneReportCallback
from nestor.tune.schedulers import ASHAScheduler


def train_fn_per_worker(config):
    import torch.distributed as dist

    world = dist.get_world_size()
    # Which process started this rank: the sweep's own driver, or a second binary.
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\0", b" ").decode()
    second = float("nestor" in parent and "/train/" in parent)
    for step in range(1, 9):
        time.sleep(0.4)
        train.report({"loss": config["lr"] * 10 / step, "world": float(world), "second": second})


def train_driver_fn(config):
    trainer = TorchTrainer(
        train_fn_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(callbacks=[TuneReportCallback()]),
    )
    trainer.fit()


storage = sys.argv[1]
grid = tune.Tuner(
    train_driver_fn,
    param_space={"lr": tune.grid_search([0.1, 0.2, 0.4, 0.8])},
    tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1,
                                scheduler=ASHAScheduler(max_t=8, grace_period=2, reduction_factor=2)),
    run_config=tune.RunConfig(name="v2", storage_path=storage),
).fit()
print("TRIALS", json.dumps({r.trial_id: {"status": r.status, "config": r.config, "error": str(r.error) if r.error else None,
                                         "history": [[h["training_iteration"], h["loss"], h["world"], h["second"]]
                                                     for h in r.metrics_history]}
                            for r in grid}))
