"""Ray Train's XGBoost pattern (XGBoostTrainer, RayTrainReportCallback),
swept by a Tuner with ASHA in boosting rounds, with only its imports changed:

    from ray import train, tune                          ->  from nestor import train, tune
    from ray.train.xgboost import XGBoostTrainer, ...    ->  from nestor.train.xgboost import XGBoostTrainer, ...

Each trial is 2 ranks in XGBoost's collective, each boosting on its half of
scikit-learn's breast-cancer data: one model across the ranks. ASHA stops
the weak trials at its rungs; a stopped or restarted trial goes on from its
saved booster.

    pip install "./python[xgboost]" scikit-learn && python examples/python/tune_xgboost.py
"""

import os

import xgboost
from sklearn.datasets import load_breast_cancer

from nestor import train, tune
from nestor.train import RunConfig, ScalingConfig
from nestor.train.xgboost import RayTrainReportCallback, XGBoostTrainer
from nestor.tune.schedulers import ASHAScheduler

ROUNDS = 12


def train_fn(config):
    x, y = load_breast_cancer(return_X_y=True)
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    dtrain = xgboost.DMatrix(x[rank::world], label=y[rank::world])
    checkpoint = train.get_checkpoint()
    booster = RayTrainReportCallback.get_model(checkpoint) if checkpoint else None
    done = booster.num_boosted_rounds() if booster else 0
    params = {"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": config["max_depth"], "eta": config["eta"]}
    xgboost.train(params, dtrain, num_boost_round=ROUNDS - done, xgb_model=booster, evals=[(dtrain, "train")],
                  callbacks=[RayTrainReportCallback(frequency=2)])


trainer = XGBoostTrainer(train_fn, scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}))
results = tune.Tuner(
    trainer,
    param_space={"train_loop_config": {"eta": tune.loguniform(1e-3, 0.5), "max_depth": tune.randint(2, 6)}},
    tune_config=tune.TuneConfig(metric="train-logloss", mode="min", num_samples=8, max_concurrent_trials=2,
                                scheduler=ASHAScheduler(max_t=ROUNDS, grace_period=2, reduction_factor=3)),
    run_config=RunConfig(name=os.environ.get("EXAMPLE_NAME", "tune-xgboost"), storage_path=os.environ.get("EXAMPLE_STORAGE")),
).fit()

rounds = sorted(len(r.metrics_dataframe) for r in results)
best = results.get_best_result()
print(f"rounds per trial: {rounds}")
print(f"best train-logloss: {best.metrics['train-logloss']:.4f} with {best.config['train_loop_config']}")
booster = RayTrainReportCallback.get_model(best.checkpoint)
print(f"best booster: {booster.num_boosted_rounds()} rounds, as many as its trial reported ({len(best.metrics_dataframe)})")
