"""A Ray Tune script with Ray's logger callbacks, imports changed to nestor's.
The MLflow server named does not exist and the W&B helper's Python has no
wandb: both fail, are logged, and the sweep goes on; TensorBoard works."""

import sys

from nestor import tune
from nestor.air.integrations.mlflow import MLflowLoggerCallback
from nestor.air.integrations.wandb import WandbLoggerCallback
from nestor.tune.logger import CSVLoggerCallback, TBXLoggerCallback


def objective(config):
    for step in range(1, 6):
        tune.report({"loss": config["x"] / step})


tuner = tune.Tuner(
    objective,
    param_space={"x": tune.uniform(0.0, 1.0)},
    tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=3, seed=3),
    run_config=tune.RunConfig(
        name="loggers",
        storage_path=sys.argv[1],
        callbacks=[
            TBXLoggerCallback(),
            CSVLoggerCallback(),
            MLflowLoggerCallback(tracking_uri="http://127.0.0.1:9", experiment_name="nowhere"),
            WandbLoggerCallback(project="p", mode="offline"),
        ],
    ),
)
grid = tuner.fit()
print("terminated:", sum(1 for r in grid if r.metrics and r.metrics.get("training_iteration") == 5))
