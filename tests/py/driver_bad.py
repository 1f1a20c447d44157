"""Bad input is refused before anything runs, naming the key. Usage: driver_bad.py STORAGE CASE"""

import sys

from nestor import tune
from nestor.tune.schedulers import ASHAScheduler, LearningCurveScheduler


def trainable(config):
    tune.report({"x": 1.0})


case = sys.argv[2]
space = {"lr": tune.loguniform(1e-3, 1e-1)}
tc = tune.TuneConfig(metric="x", mode="min")
if case == "space":
    space = {"model": {"lr": tune.loguniform(0, 1)}}
elif case == "scheduler":
    tc = tune.TuneConfig(metric="x", mode="min", scheduler=ASHAScheduler(grace_period=5, max_t=2))
elif case == "learning_curve":
    tc = tune.TuneConfig(metric="x", mode="min", scheduler=LearningCurveScheduler(time_attr="samples_seen", max_t=1000, threshold=1.5))
elif case == "value":
    space = {"opt": object()}
try:
    tune.Tuner(trainable, param_space=space, tune_config=tc, run_config=tune.RunConfig(name=case, storage_path=sys.argv[1])).fit()
except ValueError as e:
    print("REFUSED", e)
    sys.exit(0)
print("ACCEPTED")
sys.exit(1)
