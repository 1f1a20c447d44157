"""Behaviours where nestor once differed from Ray without saying so, in the
shapes Ray's doc scripts take, each checked against what Ray does.

Usage: ray_silent.py STORAGE SCENARIO
  same-second   two Tuners of one trainable started in the same second (default names)
  restore-home  Tuner.restore("~/ray_results/...") after a sweep in "~/ray_results"
  fail-fast     FailureConfig(fail_fast=True) returns the grid; fail_fast="raise" raises
  train-return  a Ray Train function's returned dict is not a result
  dir-name      train.report(..., checkpoint_dir_name=...) is found under <storage>/<name>/<dir name>
  quiet         nestor.init(log_to_driver=False): the ranks' prints stay in their logs
  echo          the ranks' prints reach this console behind their rank
Prints ``OUT {...}``.
"""

import json
import os
import sys
import tempfile

from nestor import train, tune
from nestor.train import FailureConfig, RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer


def objective(config):
    tune.report({"score": config["x"] * 2})


def failing(config):
    if config["x"] == 2:
        raise ValueError("trial with x=2 fails on purpose")
    tune.report({"score": config["x"]})


def same_second(storage: str) -> dict:
    import threading

    names, errors = [], []

    def one():
        try:
            grid = tune.Tuner(objective, param_space={"x": tune.grid_search([1, 2])},
                              run_config=tune.RunConfig(storage_path=storage)).fit()
            names.append(os.path.basename(grid.experiment_path))
            errors.extend(str(e) for e in grid.errors)
        except Exception as e:  # the collision Ray's doc scripts hit: reported, not hidden
            errors.append(f"{type(e).__name__}: {e}")

    # Three sweeps of one trainable, started at once: the same second, by their default names.
    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"names": sorted(names), "errors": errors}


def restore_home(storage: str) -> dict:
    os.environ["HOME"] = storage
    tune.Tuner(objective, param_space={"x": tune.grid_search([1, 2, 3])},
               run_config=tune.RunConfig(name="home", storage_path="~/ray_results")).fit()
    path = "~/ray_results/home"
    assert tune.Tuner.can_restore(os.path.expanduser(path))
    grid = tune.Tuner.restore(path, objective).fit()
    return {"trials": len(grid), "path": grid.experiment_path}


def fail_fast(storage: str) -> dict:
    out = {}
    grid = tune.Tuner(failing, param_space={"x": tune.grid_search([1, 2, 3, 4])},
                      tune_config=tune.TuneConfig(max_concurrent_trials=1),
                      run_config=tune.RunConfig(name="ff", storage_path=storage, failure_config=FailureConfig(fail_fast=True))).fit()
    out["grid"] = {"trials": len(grid), "errors": len(grid.errors), "error": str(grid.errors[0]) if grid.errors else ""}
    try:
        tune.Tuner(failing, param_space={"x": tune.grid_search([1, 2, 3, 4])}, tune_config=tune.TuneConfig(max_concurrent_trials=1),
                   run_config=tune.RunConfig(name="ff-raise", storage_path=storage,
                                             failure_config=FailureConfig(fail_fast="raise"))).fit()
        out["raised"] = None
    except tune.TuneError as e:
        out["raised"] = str(e)
    return out


def train_return(storage: str) -> dict:
    def loop(config):
        for step in range(3):
            train.report({"loss": 1.0 / (step + 1)})
        return {"loss": 999.0}  # Ray Train ignores a training function's return value

    result = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="ret", storage_path=storage)).fit()
    return {"loss": result.metrics["loss"], "iterations": result.metrics["training_iteration"]}


def dir_name(storage: str) -> dict:
    def loop(config):
        for epoch in range(2):
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "weights.txt"), "w") as f:
                    f.write(f"epoch {epoch}")
                train.report({"epoch": epoch}, checkpoint=train.Checkpoint.from_directory(d),
                             checkpoint_dir_name=f"checkpoint_epoch={epoch}")

    TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(name="named", storage_path=storage)).fit()
    found = {}
    for epoch in range(2):
        d = os.path.join(storage, "named", f"checkpoint_epoch={epoch}")
        with train.Checkpoint(d).as_directory() as local:
            with open(os.path.join(local, "weights.txt")) as f:
                found[epoch] = f.read()
    return {"found": found}


def user_callback(storage: str) -> dict:
    seen = []

    class Each(train.UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            seen.append([{"rank": m.get("rank"), "loss": m.get("loss")} for m in metrics])

    def loop(config):
        rank = train.get_context().get_world_rank()
        for step in range(3):
            train.report({"rank": rank, "loss": rank + step / 10})

    TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name="each", storage_path=storage, callbacks=[Each()])).fit()
    return {"seen": seen}


def printing(storage: str, quiet: bool) -> dict:
    import nestor

    if quiet:
        nestor.init(log_to_driver=False)

    def loop(config):
        print(f"hello from rank {train.get_context().get_world_rank()}", flush=True)
        train.report({"done": 1})

    TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name="quiet" if quiet else "echo", storage_path=storage)).fit()
    return {}


def main():
    storage, scenario = sys.argv[1], sys.argv[2]
    runs = {"same-second": same_second, "restore-home": restore_home, "fail-fast": fail_fast, "train-return": train_return,
            "dir-name": dir_name, "quiet": lambda s: printing(s, True), "echo": lambda s: printing(s, False),
            "user-callback": user_callback}
    print("OUT " + json.dumps(runs[scenario](storage)))


if __name__ == "__main__":
    main()
