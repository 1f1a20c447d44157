"""Gradient-boosted trees across the ranks of a trial (tests/tests/trees.rs),
on scikit-learn's bundled breast-cancer data (569 rows, 30 features).

Usage: trees.py DIR MODE [NAME]
  (2 ranks a trial)
  xgb          XGBoostTrainer(train_loop_per_worker): each rank its rows, 10 rounds, a checkpoint every 5
  xgb-legacy   Ray's older XGBoostTrainer(params=, label_column=, datasets=) over from_pandas data sets
  lgb          LightGBMTrainer: get_network_params(), 10 rounds, a checkpoint at the end
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
