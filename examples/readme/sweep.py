from nestor import tune
from nestor.tune.schedulers import ASHAScheduler


def objective(config):
    for step in range(20):
        tune.report({"loss": (config["lr"] - 0.01) ** 2 + 1 / (step + 1)})


results = tune.Tuner(
    objective,
    param_space={"lr": tune.loguniform(1e-4, 1e-1)},
    tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=16, scheduler=ASHAScheduler(max_t=20)),
).fit()
best = results.get_best_result()
print(best.config, best.metrics["loss"], best.path)
