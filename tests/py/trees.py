"""Gradient-boosted trees across the ranks of a trial (tests/tests/trees.rs),
on scikit-learn's bundled breast-cancer data (569 rows, 30 features).

Usage: trees.py DIR MODE [NAME]
  (2 ranks a trial)
  xgb          XGBoostTrainer(train_loop_per_worker): each rank its rows, 10 rounds, a checkpoint every 5
  xgb-legacy   Ray's older XGBoostTrainer(params=, label_column=, datasets=) over from_pandas data sets
  lgb          LightGBMTrainer: get_network_params(), 10 rounds, a checkpoint at the end
  tune-callbacks  Ray Tune's form: function trainables with ray.tune.integration's xgboost / lightgbm
                 TuneReportCheckpointCallback (xgboost.train, xgboost.cv, lightgbm.train) under ASHA;
                 prints TUNE <name> <json summary>
  xgb-resume NAME   XGBoostTrainer resuming from its checkpoint (every 2 rounds), $SLOW_S a round,
                 FailureConfig(max_failures=1): the test kills a rank; the rank prints its pid and start round
$PLACEMENT: the ScalingConfig's placement strategy (PACK).
Rank log lines: RANK <json> (the booster's fingerprint, its rounds); the driver prints BEST <path>,
LOADED <rounds> (the best checkpoint loaded with the framework's own Booster(model_file=...)) and ROWS.
"""

import hashlib
import json
import os
import sys

import numpy as np
from sklearn.datasets import load_breast_cancer

from nestor import train
from nestor.train import RunConfig, ScalingConfig

root, mode = sys.argv[1], sys.argv[2]
scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}, placement_strategy=os.environ.get("PLACEMENT", "PACK"))
run_config = RunConfig(name=mode, storage_path=os.path.join(root, "runs"))


def rank_line(**values):
    print("RANK " + json.dumps({"rank": train.get_context().get_world_rank(), **values}), flush=True)


def my_rows():
    x, y = load_breast_cancer(return_X_y=True)
    ctx = train.get_context()
    return x[ctx.get_world_rank()::ctx.get_world_size()], y[ctx.get_world_rank()::ctx.get_world_size()]


def fingerprint(dump):
    return hashlib.sha256("".join(dump).encode()).hexdigest()[:16]


if mode == "xgb":
    import xgboost

    from nestor.train.xgboost import RayTrainReportCallback, XGBoostTrainer

    def loop(config):
        x, y = my_rows()
        dtrain = xgboost.DMatrix(x, label=y)
        booster = xgboost.train({"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 3, "tree_method": "hist"},
                                dtrain, num_boost_round=10, evals=[(dtrain, "train")], callbacks=[RayTrainReportCallback(frequency=5)])
        rank_line(model=fingerprint(booster.get_dump()), rounds=booster.num_boosted_rounds(), rows=len(y))

    result = XGBoostTrainer(loop, scaling_config=scaling, run_config=run_config).fit()
    best = os.path.join(result.checkpoint.path, "rank-0", "model.ubj")
    print(f"BEST {best}")
    print(f"LOADED {xgboost.Booster(model_file=best).num_boosted_rounds()}")
    print(f"METRIC {result.metrics['train-logloss']}")
elif mode == "xgb-legacy":
    import pandas as pd
    import xgboost

    from nestor import data
    from nestor.train.xgboost import XGBoostTrainer

    x, y = load_breast_cancer(return_X_y=True)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])]).assign(target=y)
    train_set, valid_set = data.from_pandas(frame).train_test_split(0.25)
    result = XGBoostTrainer(params={"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "max_depth": 3},
                            label_column="target", num_boost_round=8, datasets={"train": train_set, "valid": valid_set},
                            scaling_config=scaling, run_config=run_config).fit()
    booster = XGBoostTrainer.get_model(result.checkpoint)
    print(f"LOADED {booster.num_boosted_rounds()}")
    print("METRICS " + json.dumps({k: v for k, v in result.metrics.items() if "-" in k}))
elif mode == "lgb":
    import lightgbm

    from nestor.train.lightgbm import LightGBMTrainer, RayTrainReportCallback, get_network_params

    def loop(config):
        x, y = my_rows()
        params = {"objective": "binary", "metric": "binary_logloss", "tree_learner": "data", "num_leaves": 8, "verbose": -1,
                  "min_data_in_leaf": 5, **get_network_params()}
        dtrain = lightgbm.Dataset(x, label=y)
        booster = lightgbm.train(params, dtrain, num_boost_round=10, valid_sets=[dtrain], valid_names=["train"],
                                 callbacks=[RayTrainReportCallback()])
        rank_line(model=fingerprint(booster.model_to_string().split("parameters:")[0]), rounds=booster.current_iteration(),
                  network=get_network_params(), rows=len(y))

    result = LightGBMTrainer(loop, scaling_config=scaling, run_config=run_config).fit()
    best = os.path.join(result.checkpoint.path, "rank-0", "model.txt")
    print(f"BEST {best}")
    print(f"LOADED {lightgbm.Booster(model_file=best).current_iteration()}")
    print(f"METRIC {result.metrics['train-binary_logloss']}")
elif mode == "tune-callbacks":
    # Ray Tune's own tree pattern: function trainables (one process each) calling xgboost.train,
    # xgboost.cv and lightgbm.train with ray.tune.integration's TuneReportCheckpointCallback, under ASHA.
    import lightgbm
    import xgboost
    from sklearn.model_selection import train_test_split

    from nestor import tune
    from nestor.tune.integration.lightgbm import TuneReportCheckpointCallback as LgbCallback
    from nestor.tune.integration.xgboost import TuneReportCheckpointCallback as XgbCallback
    from nestor.tune.schedulers import ASHAScheduler

    x, y = load_breast_cancer(return_X_y=True)
    tx, vx, ty, vy = train_test_split(x, y, test_size=0.25, random_state=0)

    def xgb_fn(config):
        xgboost.train(config, xgboost.DMatrix(tx, label=ty), num_boost_round=10, evals=[(xgboost.DMatrix(vx, label=vy), "test")],
                      verbose_eval=False, callbacks=[XgbCallback(frequency=1, filename="booster.json")])

    def xgb_cv_fn(config):
        def folds_mean(results):
            return {k: float(np.mean(v)) for k, v in results.items()}

        xgboost.cv(config, xgboost.DMatrix(x, label=y), num_boost_round=10, nfold=3, verbose_eval=False,
                   callbacks=[XgbCallback(results_postprocessing_fn=folds_mean, frequency=0)])

    def lgb_fn(config):
        lightgbm.train(config, lightgbm.Dataset(tx, label=ty), num_boost_round=10, valid_sets=[lightgbm.Dataset(vx, label=vy)],
                       valid_names=["eval"], callbacks=[LgbCallback({"logloss": "eval-binary_logloss"})])

    xgb_space = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "max_depth": tune.randint(1, 9),
                 "eta": tune.grid_search([0.3, 0.1, 0.01, 0.001])}
    runs = [("xgb", xgb_fn, xgb_space, "test-logloss"), ("xgb-cv", xgb_cv_fn, xgb_space, "test-logloss"),
            ("lgb", lgb_fn, {"objective": "binary", "metric": "binary_logloss", "verbose": -1, "num_leaves": tune.randint(2, 32),
                             "learning_rate": tune.grid_search([0.3, 0.1, 0.01, 0.001])}, "logloss")]
    for name, fn, space, metric in runs:
        grid = tune.Tuner(tune.with_resources(fn, resources={"cpu": 1}), param_space=space,
                          tune_config=tune.TuneConfig(metric=metric, mode="min", scheduler=ASHAScheduler(max_t=10, grace_period=1, reduction_factor=2)),
                          run_config=RunConfig(name=name, storage_path=os.path.join(root, "runs"))).fit()
        best = grid.get_best_result()
        summary = {"iterations": sorted(r.metrics["training_iteration"] for r in grid), "errors": sum(r.error is not None for r in grid),
                   "best": best.metrics[metric], "checkpoint": bool(best.checkpoint)}
        if name == "xgb":
            summary["loaded"] = XgbCallback.get_model(best.checkpoint, filename="booster.json").num_boosted_rounds()
            summary["best_iteration"] = best.metrics["training_iteration"]
        if name == "lgb":
            summary["loaded"] = LgbCallback.get_model(best.checkpoint).current_iteration()
            summary["best_iteration"] = best.metrics["training_iteration"]
        print(f"TUNE {name} " + json.dumps(summary), flush=True)
elif mode == "xgb-resume":
    import time

    import xgboost

    from nestor.train import FailureConfig
    from nestor.train.xgboost import RayTrainReportCallback, XGBoostTrainer

    class Slow(xgboost.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            time.sleep(float(os.environ.get("SLOW_S", "0")))
            return False

    def loop(config):
        x, y = my_rows()
        dtrain = xgboost.DMatrix(x, label=y)
        checkpoint = train.get_checkpoint()
        booster = RayTrainReportCallback.get_model(checkpoint) if checkpoint else None
        start = booster.num_boosted_rounds() if booster else 0
        rank_line(pid=os.getpid(), start=start)
        booster = xgboost.train({"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 3, "tree_method": "hist"},
                                dtrain, num_boost_round=10 - start, evals=[(dtrain, "train")], xgb_model=booster,
                                callbacks=[Slow(), RayTrainReportCallback(frequency=2)])
        rank_line(model=fingerprint(booster.get_dump()), rounds=booster.num_boosted_rounds())

    name = sys.argv[3]
    XGBoostTrainer(loop, scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                   run_config=RunConfig(name=name, storage_path=os.path.join(root, "runs"),
                                        failure_config=FailureConfig(max_failures=1))).fit()
