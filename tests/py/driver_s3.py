"""A function trainable whose checkpoints go to an S3 bucket: each rank
uploads its own shard (`nestor put-shard`), and the best checkpoint comes
back through `as_directory()` (`nestor fetch`). Usage: driver_s3.py"""

import json
import os
import tempfile

from nestor import train, tune


def trainable(config):
    for step in range(1, 4):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step, "a": config["a"], "rank": train.get_context().get_world_rank()}, f)
            tune.report({"score": config["a"] * step}, checkpoint=tune.Checkpoint.from_directory(d))


grid = tune.Tuner(
    tune.with_resources(trainable, {"cpu": 0.5}),
    param_space={"a": tune.grid_search([1.0, 2.0])},
    tune_config=tune.TuneConfig(metric="score", mode="max"),
    run_config=tune.RunConfig(name="s3", storage_path="s3://bucket/runs"),
).fit()
best = grid.get_best_result()
print("CHECKPOINT", best.checkpoint.path)
with best.checkpoint.as_directory() as d:
    print("STATE", open(os.path.join(d, "state.json")).read())
