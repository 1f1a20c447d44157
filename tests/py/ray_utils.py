"""Ray Tune's helpers and searchers as Ray's own examples use them.

Usage: ray_utils.py STORAGE SCENARIO

  multiobjective  OptunaSearch(metric=["loss", "gain"], mode=["min", "max"]) under a
                  ConcurrencyLimiter (Ray's optuna_multiobjective_example): Optuna's study
                  of two directions is told both metrics of every trial
  mock            MyTrainableClass (ray.tune.utils.mock_trainable) under HyperBand, as
                  Ray's hyperband_example runs it; validate_save_restore on it and on a
                  trainable that loses its state; the nested-dict helpers
  hyperopt        HyperOptSearch (ray.tune.search.hyperopt) over a param_space: nestor's TPE
                  with HyperOpt's settings; a HyperOpt `hp` space is refused
  resources       tune.with_resources(fn, PlacementGroupFactory([...])) (Ray's
                  xgboost_dynamic_resources_example's import path): a trial gets its bundles
                  in all, and get_trial_resources() answers with a PlacementGroupFactory
"""

import json
import os
import pickle
import sys
import time

from nestor import tune
from nestor.tune.schedulers import HyperBandScheduler
from nestor.tune.search import ConcurrencyLimiter
from nestor.tune.search.optuna import OptunaSearch


def objective(config):
    for step in range(config["steps"]):
        loss = (0.1 + config["width"] * step / 100) ** (-1) + config["height"] * 0.1
        tune.report({"iterations": step, "loss": loss, "gain": loss * config["width"], "kind": config["kind"]["name"]})
        time.sleep(0.01)


def multiobjective(storage):
    algo = ConcurrencyLimiter(OptunaSearch(metric=["loss", "gain"], mode=["min", "max"], seed=7), max_concurrent=2)
    tuner = tune.Tuner(
        objective,
        tune_config=tune.TuneConfig(search_alg=algo, num_samples=8),
        param_space={"steps": 5, "width": tune.uniform(0, 20), "height": tune.uniform(-100, 100),
                     "kind": tune.choice([{"name": "a"}, {"name": "b"}]), "n": tune.randint(1, 4)},
        run_config=tune.RunConfig(name="multi", storage_path=storage),
    )
    grid = tuner.fit()
    study = pickle.load(open(os.path.join(storage, "multi", "driver", "search.pkl"), "rb")).study
    told = [{"values": t.values, "state": t.state.name, "params": t.params} for t in study.trials]
    configs = [r.config for r in grid]
    best = {m: grid.get_best_result(m, o).metrics[m] for m, o in (("loss", "min"), ("gain", "max"))}
    print("MULTI " + json.dumps({"directions": [d.name for d in study.directions], "told": told, "configs": configs,
                                 "best": best, "last": [{k: r.metrics[k] for k in ("loss", "gain")} for r in grid]}))
    try:
        tune.Tuner(objective, tune_config=tune.TuneConfig(metric=["loss", "gain"], mode=["min", "max"]),
                   param_space={"steps": 1}).fit()
    except ValueError as e:
        print("REFUSED " + json.dumps(str(e)))


def mock(storage):
    from nestor.tune.utils import (deep_update, flatten_dict, merge_dicts, unflatten_dict, unflattened_lookup,
                                   validate_save_restore)
    from nestor.tune.utils.mock_trainable import MyTrainableClass

    tuner = tune.Tuner(
        MyTrainableClass,
        run_config=tune.RunConfig(name="hyperband", storage_path=storage, stop={"training_iteration": 9}),
        tune_config=tune.TuneConfig(metric="episode_reward_mean", mode="max", num_samples=6,
                                    scheduler=HyperBandScheduler(max_t=9, reduction_factor=3)),
        param_space={"width": tune.randint(10, 90), "height": tune.randint(0, 100)},
    )
    grid = tuner.fit()
    trials = {r.metrics["trial_id"]: {"config": r.config, "iteration": r.metrics["training_iteration"],
                                      "timesteps": r.metrics["timesteps_total"], "reward": r.metrics["episode_reward_mean"]}
              for r in grid}
    print("TRIALS " + json.dumps(trials))

    class Forgetful(tune.Trainable):
        def setup(self, config):
            self.n = 0

        def step(self):
            self.n += 1
            return {"n": self.n}

    checks = {"mock": validate_save_restore(MyTrainableClass, {"width": 5, "height": 3})}
    try:
        validate_save_restore(Forgetful)
        checks["forgetful"] = "passed"
    except AssertionError as e:
        checks["forgetful"] = str(e)
    nested = {"a": {"b": 1, "c": {"d": [1, 2]}}, "e": 2}
    flat = flatten_dict(nested)
    checks["flat"] = flat
    checks["round_trip"] = unflatten_dict(flat) == nested
    checks["lookup"] = unflattened_lookup("a/c/d", nested)
    checks["merged"] = merge_dicts({"a": {"b": 1}, "x": 1}, {"a": {"c": 2}})
    try:
        deep_update({"a": 1}, {"b": 2})
        checks["deep_update"] = "accepted"
    except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception
        checks["deep_update"] = str(e)
    print("CHECKS " + json.dumps(checks))


def report_resources(config):
    r = tune.get_context().get_trial_resources()
    tune.report({"head_cpus": r.head_cpus, "cpus": r["CPU"], "bundles": len(r.bundles),
                 "omp": float(os.environ.get("OMP_NUM_THREADS", "0"))})


def resources(storage):
    from nestor.tune.execution.placement_groups import PlacementGroupFactory

    tuner = tune.Tuner(
        tune.with_resources(report_resources, resources=PlacementGroupFactory([{"CPU": 1}, {"CPU": 1}])),
        tune_config=tune.TuneConfig(metric="cpus", mode="max", num_samples=1),
        run_config=tune.RunConfig(name="pgf", storage_path=storage),
    )
    m = tuner.fit().get_best_result().metrics
    print("RESOURCES " + json.dumps({k: m[k] for k in ("head_cpus", "cpus", "bundles", "omp")}))
    try:
        PlacementGroupFactory([{"CPU": -1}])
    except ValueError as e:
        print("REFUSED " + json.dumps(str(e)))


def hyperopt(storage):
    from nestor.tune.search.hyperopt import HyperOptSearch

    def quadratic(config):
        tune.report({"loss": (config["x"] - 0.3) ** 2 + (config["y"] - 0.6) ** 2})

    algo = ConcurrencyLimiter(HyperOptSearch(metric="loss", mode="min", n_initial_points=4, random_state_seed=11), max_concurrent=2)
    grid = tune.Tuner(quadratic, tune_config=tune.TuneConfig(search_alg=algo, num_samples=12),
                      param_space={"x": tune.uniform(0, 1), "y": tune.uniform(0, 1)},
                      run_config=tune.RunConfig(name="hyperopt", storage_path=storage)).fit()
    sweep = open(os.path.join(storage, "hyperopt", "driver", "sweep.toml")).read()
    print("HYPEROPT " + json.dumps({"trials": len(grid), "sweep": sweep, "best": grid.get_best_result().metrics["loss"]}))
    try:
        HyperOptSearch(space={"x": object()}, metric="loss", mode="min")
    except ValueError as e:
        print("REFUSED " + json.dumps(str(e)))


if __name__ == "__main__":
    storage, scenario = sys.argv[1], sys.argv[2]
    {"multiobjective": multiobjective, "mock": mock, "resources": resources, "hyperopt": hyperopt}[scenario](storage)
