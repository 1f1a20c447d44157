"""A function trainable swept with ASHA, written as for Ray Tune with only
the imports changed (`from ray import tune` -> `from nestor import tune`).
Needs no GPU and no torch:

    pip install ./python && python examples/python/tune_function.py
"""

import json
import os
import tempfile

from nestor import tune
from nestor.tune.schedulers import ASHAScheduler


def objective(config):
    # Resume where the last checkpoint left off (after a restart or a pause).
    step, x = 0, 0.0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                state = json.load(f)
            step, x = state["step"], state["x"]
    while step < 20:
        step += 1
        # A toy learning curve: converges faster with a good lr, to a floor set by width.
        x += config["lr"] * (1.0 - x)
        loss = (1.0 - x) + 1.0 / config["model"]["width"]
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step, "x": x}, f)
            # Values that are not numbers are kept with the result too.
            phase = "warmup" if step <= 2 else "main"
            tune.report({"loss": loss, "step": step, "phase": phase}, checkpoint=tune.Checkpoint.from_directory(d))


tuner = tune.Tuner(
    objective,
    param_space={
        "lr": tune.loguniform(1e-3, 0.5),
        "model": {"width": tune.choice([16, 64, 256])},
    },
    tune_config=tune.TuneConfig(
        metric="loss", mode="min", num_samples=12, scheduler=ASHAScheduler(max_t=20, grace_period=2, reduction_factor=3)
    ),
    run_config=tune.RunConfig(name=os.environ.get("EXAMPLE_NAME", "tune-function"), storage_path=os.environ.get("EXAMPLE_STORAGE")),
)
results = tuner.fit()
best = results.get_best_result()
print(f"best config: {best.config}")
print(f"best loss: {best.metrics['loss']:.4f} after {best.metrics['training_iteration']} iterations ({best.metrics['phase']})")
with best.checkpoint.as_directory() as d:
    with open(os.path.join(d, "state.json")) as f:
        print(f"best checkpoint: {best.checkpoint.path} holds step {json.load(f)['step']}")
