"""Python code the sweep calls: Ray's callbacks, stop functions and
stoppers, PBT's callable mutations and custom explore step.

Usage: ray_hooks.py STORAGE SCENARIO [run|restore]

  callbacks  a Callback recording every hook, a LoggerCallback recording
             its log_trial_* calls, and one that raises in every hook
  hang       a callback that blocks forever in its first hook (NESTOR_CALLBACK_DEADLINE_S cuts it off)
  stop_fn    stop=lambda trial_id, result: ...
  stopper    a Stopper subclass whose stop_all ends the sweep
  pbt        PBT with lambda mutations and a custom_explore_fn
  sample     tune.sample_from: of the spec, of nothing, nested, and one reading another
  optuna     OptunaSearch(space=fn): a conditional define-by-run space, run by Optuna in the script
  crash      callbacks writing to $HOOKS_LOG, for a kill and a restore ($ACKS as ray_class.py)
"""

import json
import os
import random
import sys
import time

from nestor import train, tune
from nestor.tune.logger import LoggerCallback
from nestor.tune.schedulers import PopulationBasedTraining


def steps(config):
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read())
    for step in range(start + 1, config.get("steps", 6) + 1):
        if os.environ.get("ACKS"):
            time.sleep(0.05)
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            train.report({"score": config.get("lr", 1.0) * step, "lr": config.get("lr", 1.0)},
                         checkpoint=train.Checkpoint.from_directory(d))
        if os.environ.get("ACKS"):
            with open(os.environ["ACKS"], "a") as f:
                f.write(f"{train.get_context().get_trial_id()} {step}\n")


class Recorder(tune.Callback):
    def __init__(self, log=None):
        self.calls = []
        self.log = log

    def _note(self, *call):
        self.calls.append(list(call))
        if self.log:
            with open(self.log, "a") as f:
                f.write(json.dumps(list(call)) + "\n")

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self._note("setup", num_samples)

    def on_trial_start(self, iteration, trials, trial, **info):
        self._note("on_trial_start", trial.trial_id, trial.config)

    def on_trial_restore(self, iteration, trials, trial, **info):
        self._note("on_trial_restore", trial.trial_id)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._note("on_trial_result", trial.trial_id, result["training_iteration"], result["score"])

    def on_trial_save(self, iteration, trials, trial, **info):
        self._note("on_trial_save", trial.trial_id)

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        self._note("on_checkpoint", trial.trial_id, os.path.basename(checkpoint.path))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._note("on_trial_complete", trial.trial_id, trial.status)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._note("on_trial_error", trial.trial_id)

    def on_experiment_end(self, trials, **info):
        self._note("on_experiment_end", sorted(t.trial_id for t in trials))


class Logger(LoggerCallback):
    def __init__(self):
        self.lines = []

    def log_trial_start(self, trial):
        self.lines.append(["start", trial.trial_id])

    def log_trial_result(self, iteration, trial, result):
        self.lines.append(["result", trial.trial_id, result["training_iteration"]])

    def log_trial_end(self, trial, failed=False):
        self.lines.append(["end", trial.trial_id, failed])


class Raises(tune.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        raise RuntimeError("a callback that fails")

    def on_trial_complete(self, iteration, trials, trial, **info):
        raise KeyError("another failure")


class Hangs(tune.Callback):
    def on_trial_start(self, iteration, trials, trial, **info):
        while True:
            time.sleep(1)


class Budget(tune.Stopper):
    """Stops a trial at score >= 4; the sweep after 7 results in all."""

    def __init__(self):
        self.seen = 0

    def __call__(self, trial_id, result):
        self.seen += 1
        return result["score"] >= 4

    def stop_all(self):
        return self.seen >= 7


def clamp(config):
    config["lr"] = min(config["lr"], 0.05)
    return config


def main():
    storage, scenario = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "run"
    space = {"lr": tune.grid_search([1.0, 2.0, 3.0])}
    out = {}
    if scenario == "callbacks":
        rec, logger = Recorder(), Logger()
        grid = tune.Tuner(steps, param_space=space, tune_config=tune.TuneConfig(metric="score", mode="max"),
                          run_config=tune.RunConfig(name=scenario, storage_path=storage,
                                                    callbacks=[Raises(), rec, logger])).fit()
        out = {"calls": rec.calls, "logger": logger.lines}
    elif scenario == "hang":
        rec = Recorder()
        start = time.time()
        grid = tune.Tuner(steps, param_space=space, tune_config=tune.TuneConfig(metric="score", mode="max"),
                          run_config=tune.RunConfig(name=scenario, storage_path=storage, callbacks=[Hangs(), rec])).fit()
        out = {"seconds": time.time() - start}
    elif scenario == "stop_fn":
        grid = tune.Tuner(steps, param_space=space, tune_config=tune.TuneConfig(metric="score", mode="max"),
                          run_config=tune.RunConfig(name=scenario, storage_path=storage,
                                                    stop=lambda trial_id, result: result["score"] >= 5)).fit()
    elif scenario == "stopper":
        grid = tune.Tuner(steps, param_space={"lr": tune.grid_search([1.0, 0.5, 0.25])},
                          tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
                          run_config=tune.RunConfig(name=scenario, storage_path=storage, stop=Budget())).fit()
    elif scenario == "pbt":
        pbt = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=2, quantile_fraction=0.5,
                                      resample_probability=0.5,
                                      hyperparam_mutations={"lr": lambda: random.uniform(0.001, 0.1)},
                                      custom_explore_fn=clamp)
        grid = tune.Tuner(steps, param_space={"lr": tune.uniform(0.001, 0.1), "steps": 8},
                          tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=4, seed=2, scheduler=pbt),
                          run_config=tune.RunConfig(name=scenario, storage_path=storage)).fit()
    elif scenario == "sample":
        import numpy as np

        def report_config(config):
            train.report({"score": 1.0})

        space = {
            "width": tune.choice([16, 32, 64]),
            "depth": tune.sample_from(lambda spec: spec.config.width // 16),   # reads a sampled value
            "noise": tune.sample_from(lambda: np.random.uniform(0, 1)),       # a fresh draw per trial
            "opt": {"lr": tune.loguniform(1e-4, 1e-1), "decay": tune.sample_from(lambda spec: spec["config"]["opt"]["lr"] / 10)},
            "last": tune.sample_from(lambda spec: spec.config.depth + 100),   # reads another sample_from value
        }
        grid = tune.Tuner(report_config, param_space=space,
                          tune_config=tune.TuneConfig(num_samples=6, seed=int(os.environ.get("SEED", "4"))),
                          run_config=tune.RunConfig(name=scenario + os.environ.get("SEED", "4") + os.environ.get("RUN", ""),
                                                    storage_path=storage)).fit()
    elif scenario == "optuna":
        from nestor.tune.search.optuna import OptunaSearch

        def define_space(trial):
            activation = trial.suggest_categorical("activation", ["relu", "tanh"])
            if activation == "relu":
                trial.suggest_float("nested/mult", 0.01, 0.05, log=True)
            else:
                trial.suggest_int("height", -10, 10)
            return {"steps": 3}

        def objective(config):
            for step in range(config["steps"]):
                loss = config["nested"]["mult"] * 10 if config["activation"] == "relu" else abs(config["height"]) / 10 + 0.1
                train.report({"loss": loss})

        tuner = tune.Tuner(objective, tune_config=tune.TuneConfig(
            num_samples=10, search_alg=OptunaSearch(space=define_space, metric="loss", mode="min", seed=3)),
            run_config=tune.RunConfig(name=scenario, storage_path=storage))
        grid = tuner.fit()
        from nestor._hooks import DefineByRun

        # The study as the driver saved it beside the experiment (what Tuner.restore goes on with).
        study = DefineByRun.saved(os.path.join(storage, scenario)).study
        out["told"] = sum(1 for t in study.trials if t.state.name == "COMPLETE")
        out["trials"] = {r.trial_id: {"config": r.config, "loss": r.metrics["loss"]} for r in grid}
    elif scenario == "crash":
        path = os.path.join(storage, scenario)
        trainable = tune.with_resources(steps, {"cpu": 0.5})
        if mode == "restore":
            grid = tune.Tuner.restore(path, trainable).fit()
        else:
            grid = tune.Tuner(trainable, param_space={"lr": tune.grid_search([1.0, 2.0, 3.0, 4.0]), "steps": 30},
                              tune_config=tune.TuneConfig(metric="score", mode="max"),
                              run_config=tune.RunConfig(name=scenario, storage_path=storage,
                                                        callbacks=[Recorder(os.environ["HOOKS_LOG"])])).fit()
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    out["trials"] = out["trials"] if "trials" in out else {r.trial_id: {"status": r.status, "config": r.config,
                                  "history": [[h["training_iteration"], h["score"]] for h in r.metrics_history]} for r in grid}
    print("OUT", json.dumps(out))


if __name__ == "__main__":
    main()
