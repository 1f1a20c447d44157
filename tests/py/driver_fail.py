"""A training function that raises on rank 1 at its second step, through
TorchTrainer.fit() (raises TrainingFailedError) and through a Tuner (the
error is in the ResultGrid). Usage: driver_fail.py STORAGE fit|tuner"""

import sys

from nestor import train, tune
from nestor.train import RunConfig, ScalingConfig, TrainingFailedError
from nestor.train.torch import TorchTrainer


def train_func(config):
    for step in range(1, 4):
        if step == 2 and train.get_context().get_world_rank() == 1:
            raise ValueError(f"boom at step {step} with lr={config['lr']}")
        train.report({"step": step})


trainer = TorchTrainer(train_func, train_loop_config={"lr": 0.5},
                       scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                       run_config=RunConfig(name=f"fail-{sys.argv[2]}", storage_path=sys.argv[1]))
if sys.argv[2] == "fit":
    try:
        trainer.fit()
    except TrainingFailedError as e:
        print("RAISED", type(e).__name__)
        print(str(e))
        sys.exit(0)
    print("DID NOT RAISE")
    sys.exit(1)
grid = tune.Tuner(trainer, param_space={"train_loop_config": {"lr": tune.grid_search([0.1, 0.2])}}).fit()
print("ERRORS", grid.num_errors, "TERMINATED", grid.num_terminated)
print(str(grid.errors[0]))
