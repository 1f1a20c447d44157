"""The same sweep from Python, to compare with its TOML file (tests/tests/ray_scripts.rs).

Usage: ray_frontends.py STORAGE asha|hyperband|pbt
"""

import sys

from nestor import train, tune
from nestor.tune.schedulers import ASHAScheduler, HyperBandScheduler, PopulationBasedTraining


def objective(config):
    for step in range(1, 4):
        train.report({"loss": config["lr"] / step, "samples": 100.0 * step})


storage, which = sys.argv[1], sys.argv[2]
space = {"lr": tune.loguniform(1e-4, 1e-1), "layers": tune.randint(1, 4), "act": tune.choice(["relu", "tanh"])}
scheduler = {
    # A cost as time_attr: the binary's default grace period for it, not Ray's 1.
    "asha": ASHAScheduler(time_attr="samples", max_t=300, reduction_factor=3),
    "hyperband": HyperBandScheduler(max_t=3),
    "pbt": PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=1,
                                   hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1)}),
}[which]
tune.Tuner(
    objective,
    param_space=space,
    tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=4, seed=3, scheduler=scheduler),
    run_config=tune.RunConfig(name=which, storage_path=storage, stop={"training_iteration": 3},
                              checkpoint_config=train.CheckpointConfig(num_to_keep=2)),
).fit()
