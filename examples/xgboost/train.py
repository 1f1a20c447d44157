"""Distributed XGBoost under nestor, from an experiment file (sweep.toml).

nestor starts this script once per rank of a trial. `backend.run` runs
`main` between XGBoostConfig's hooks, as an `XGBoostTrainer` would: rank 0
starts XGBoost's tracker and every rank joins its collective, so the ranks
train one booster, each on its half of the rows. `RayTrainReportCallback`
reports the eval metrics every boosting round (ASHA stops weak trials in
rounds) and checkpoints the booster; a restarted trial goes on from the
saved booster's round. Each rank prints a fingerprint of its booster at the
end (`MODEL ...`), the same on every rank.

Data: scikit-learn's bundled breast-cancer set (569 rows), a seeded 80/20
split. Run by hand (no nestor): `python train.py` trains one rank with defaults.
"""

import hashlib

import numpy as np
import xgboost
from sklearn.datasets import load_breast_cancer

import nestor
from nestor import train
from nestor.train.backend import run
from nestor.train.xgboost import RayTrainReportCallback, XGBoostConfig


def main() -> None:
    config = {"eta": 0.3, "max_depth": 4, "subsample": 1.0, "num_boost_round": 30, **nestor.get_config()}
    ctx = train.get_context()
    x, y = load_breast_cancer(return_X_y=True)
    valid = np.random.default_rng(0).random(len(y)) < 0.2
    # Each rank its share of the training rows; the same validation rows everywhere.
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    dtrain = xgboost.DMatrix(x[~valid][rank::world], label=y[~valid][rank::world])
    dvalid = xgboost.DMatrix(x[valid], label=y[valid])
    checkpoint = train.get_checkpoint()
    booster = RayTrainReportCallback.get_model(checkpoint) if checkpoint else None
    done = booster.num_boosted_rounds() if booster else 0
    params = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "tree_method": "hist",
              "eta": config["eta"], "max_depth": int(config["max_depth"]), "subsample": config["subsample"], "seed": 0}
    booster = xgboost.train(params, dtrain, num_boost_round=int(config["num_boost_round"]) - done, xgb_model=booster,
                            evals=[(dtrain, "train"), (dvalid, "valid")], verbose_eval=False,
                            callbacks=[RayTrainReportCallback(frequency=5)])
    # The same on every rank: one booster trained across them.
    print(f"MODEL {hashlib.sha256(''.join(booster.get_dump()).encode()).hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    run(XGBoostConfig(), main)
