"""Ray Train V2's Tune pattern, booked: each trial's resources become its
trainer's ScalingConfig. On a pool of 2 CPUs (init(num_cpus=2)), trainers
of 2 workers x 1 CPU can only run one at a time, with no
max_concurrent_trials to say so; each rank logs when it runs.

Usage: ray_v2_booking.py STORAGE LOGDIR fits|never
"""

import json
import os
import sys
import time

import nestor
from nestor import train, tune
from nestor.train import RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer
from nestor.tune.integration.ray_train import TuneReportCallback

storage, logdir, mode = sys.argv[1], sys.argv[2], sys.argv[3]


def train_fn_per_worker(config):
    import torch.distributed as dist

    ctx = train.get_context()
    began = time.time()
    for step in range(1, 4):
        time.sleep(0.3)
        train.report({"loss": config["lr"] / step, "world": float(dist.get_world_size())})
    with open(os.path.join(config["logdir"], f"{config['lr']}-rank{ctx.get_world_rank()}.json"), "w") as f:
        json.dump({"began": began, "ended": time.time(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)


def train_driver_fn(config):
    workers = 3 if config["mode"] == "never" else 2
    trainer = TorchTrainer(
        train_fn_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(callbacks=[TuneReportCallback()]),
    )
    trainer.fit()


nestor.init(num_cpus=2)
grid = tune.Tuner(
    train_driver_fn,
    param_space={"lr": tune.grid_search([0.1, 0.2, 0.4, 0.8]), "logdir": logdir, "mode": mode},
    tune_config=tune.TuneConfig(metric="loss", mode="min"),
    run_config=tune.RunConfig(name="booked", storage_path=storage),
).fit()
print("TRIALS", json.dumps({r.trial_id: {"status": r.status, "config": r.config, "error": str(r.error) if r.error else None,
                                         "results": len(r.metrics_history)} for r in grid}))
