"""Class trainables (tune.Trainable) in the shapes Ray's examples use them.

Usage: ray_class.py STORAGE SCENARIO [run|restore]

The trainable keeps a running state (a total and the iterations it has
seen) that only its checkpoints carry from one run to the next: every
result reports `seen`, the number of steps the state has been through, so a
run that resumed without its state (or with another trial's) shows it.

Scenarios:
  hyperband  HyperBand pauses and resumes trials; state in a dict checkpoint
  bohb       TuneBOHB with HyperBandForBOHB; state in files of the checkpoint dir
  pbt        PBT, 8 samples on init(num_cpus=2): every trial pauses at its
             interval so the whole population takes part; exploits copy state
  done       a step returns done=True at iteration `stop_at`: the trial ends there
  crash      4 trials of 30 slow steps, for a kill and a restore; each
             acknowledged result is appended to $ACKS
  budget     2 trials of endless 0.4 s steps, ended mid-step by a 3 s time budget
"""

import json
import os
import sys
import time

import nestor
from nestor import tune
from nestor.tune.schedulers import HyperBandForBOHB, HyperBandScheduler, PopulationBasedTraining
from nestor.tune.search.bohb import TuneBOHB


class Accumulate(tune.Trainable):
    """Adds `rate` to a total each step; the total and the count of steps
    travel in a pickled dict checkpoint."""

    def setup(self, config, offset=0.0):
        self.rate = config["rate"]
        self.total = offset
        self.seen = 0
        self.cleaned = False

    def step(self):
        if os.environ.get("ACKS"):
            # The previous step's report has returned: it was acknowledged.
            if self.iteration > 0:
                with open(os.environ["ACKS"], "a") as f:
                    f.write(f"{self.trial_id} {self.iteration}\n")
            time.sleep(0.05)
        self.seen += 1
        self.total += self.rate
        result = {"score": self.total, "seen": self.seen, "rate": self.rate}
        if "stop_at" in self.config and self.iteration + 1 >= self.config["stop_at"]:
            result["done"] = True
        return result

    def save_checkpoint(self, checkpoint_dir):
        return {"total": self.total, "seen": self.seen}

    def load_checkpoint(self, checkpoint):
        self.total = checkpoint["total"]
        self.seen = checkpoint["seen"]

    def reset_config(self, new_config):
        raise AssertionError("nestor never reuses a run's process")

    def cleanup(self):
        # Proof that cleanup ran at the end of every run: a file per run.
        marks = os.path.join(self.logdir, "cleanups")
        os.makedirs(marks, exist_ok=True)
        open(os.path.join(marks, f"{os.getpid()}"), "w").close()


class AccumulateFiles(Accumulate):
    """The same state, written as files into the checkpoint directory."""

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as f:
            json.dump({"total": self.total, "seen": self.seen}, f)

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state.json")) as f:
            state = json.load(f)
        self.total, self.seen = state["total"], state["seen"]


def main():
    storage, scenario = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "run"
    rates = tune.uniform(0.1, 1.0)
    run = tune.RunConfig(name=scenario, storage_path=storage)
    if scenario == "hyperband":
        tuner = tune.Tuner(
            tune.with_parameters(Accumulate, offset=0.0),
            param_space={"rate": rates},
            tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=9, max_concurrent_trials=3,
                                        scheduler=HyperBandScheduler(max_t=9, reduction_factor=3), seed=3),
            run_config=run,
        )
    elif scenario == "bohb":
        tuner = tune.Tuner(
            AccumulateFiles,
            param_space={"rate": rates},
            tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=8, max_concurrent_trials=2,
                                        search_alg=TuneBOHB(seed=5), scheduler=HyperBandForBOHB(max_t=9, reduction_factor=3)),
            run_config=run,
        )
    elif scenario == "pbt":
        nestor.init(num_cpus=2)
        tuner = tune.Tuner(
            Accumulate,
            param_space={"rate": tune.uniform(0.1, 1.0)},
            tune_config=tune.TuneConfig(
                metric="score", mode="max", num_samples=8, seed=11,
                scheduler=PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=4,
                                                  quantile_fraction=0.5, resample_probability=0.5,
                                                  hyperparam_mutations={"rate": tune.uniform(0.1, 1.0)}),
            ),
            run_config=tune.RunConfig(name=scenario, storage_path=storage, stop={"training_iteration": 24}),
        )
    elif scenario == "done":
        tuner = tune.Tuner(
            Accumulate,
            param_space={"rate": 1.0, "stop_at": tune.grid_search([2, 5])},
            tune_config=tune.TuneConfig(metric="score", mode="max"),
            run_config=tune.RunConfig(name=scenario, storage_path=storage, stop={"training_iteration": 50}),
        )
    elif scenario == "crash":
        path = os.path.join(storage, scenario)
        trainable = tune.with_resources(AccumulateFiles, {"cpu": 0.5})
        if mode == "restore":
            assert tune.Tuner.can_restore(path), path
            tuner = tune.Tuner.restore(path, trainable)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space={"rate": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
                tune_config=tune.TuneConfig(metric="score", mode="max"),
                run_config=tune.RunConfig(name=scenario, storage_path=storage, stop={"training_iteration": 30},
                                          checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1)),
            )
    elif scenario == "budget":

        class SlowSteps(Accumulate):
            def step(self):
                time.sleep(0.4)
                return super().step()

        tuner = tune.Tuner(
            tune.with_resources(SlowSteps, {"cpu": 0.5}),
            param_space={"rate": tune.grid_search([1.0, 2.0])},
            tune_config=tune.TuneConfig(metric="score", mode="max", time_budget_s=3),
            run_config=tune.RunConfig(name=scenario, storage_path=storage),
        )
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    grid = tuner.fit()
    out = {}
    for r in grid:
        out[r.trial_id] = {
            "status": r.status,
            "config": r.config,
            "history": [[h["training_iteration"], h["seen"], h["score"]] for h in r.metrics_history],
            "error": str(r.error) if r.error else None,
        }
    print("TRIALS", json.dumps(out))
    best = grid.get_best_result()
    print("BEST", json.dumps({"trial_id": best.trial_id, "score": best.metrics["score"]}))


if __name__ == "__main__":
    main()
