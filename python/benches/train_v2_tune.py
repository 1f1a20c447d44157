"""Benchmark: Ray Train V2's Tune pattern against ``Tuner(TorchTrainer)``.
4 trials, each a trainer of 2 DDP ranks (gloo) that report 5 times, 2
trials at a time, timed as a whole ``python sweep.py`` (interpreter start,
imports, the sweep, the results):

- ``v2``: a function trainable builds a ``TorchTrainer`` with
  ``RunConfig(callbacks=[TuneReportCallback()])`` and calls ``fit()``
  (each trial books its trainer's bundles and the driver runs its ranks);
- ``tuner``: ``Tuner(TorchTrainer(...))`` over the same 4 configs.

    python python/benches/train_v2_tune.py [--kind v2|tuner|both] [--reps 3]

The ``nestor`` package and binary are the environment's (``NESTOR_BIN``).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

SWEEP = r'''
import sys
from nestor import train, tune
from nestor.train import RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer
from nestor.tune.integration.ray_train import TuneReportCallback


def per_worker(config):
    import torch
    import torch.distributed as dist

    x = torch.ones(4)
    for step in range(1, 6):
        dist.all_reduce(x)
        train.report({"loss": config["lr"] / step})


SCALING = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5})
SPACE = {"lr": tune.grid_search([0.1, 0.2, 0.4, 0.8])}
KIND = sys.argv[2]
if KIND == "v2":
    def driver(config):
        TorchTrainer(per_worker, train_loop_config=config, scaling_config=SCALING,
                     run_config=RunConfig(callbacks=[TuneReportCallback()])).fit()

    tuner = tune.Tuner(driver, param_space=SPACE,
                       tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
                       run_config=tune.RunConfig(name="bench", storage_path=sys.argv[1]))
else:
    tuner = tune.Tuner(TorchTrainer(per_worker, scaling_config=SCALING), param_space={"train_loop_config": SPACE},
                       tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
                       run_config=tune.RunConfig(name="bench", storage_path=sys.argv[1]))
grid = tuner.fit()
assert len(grid) == 4 and all(r.status == "TERMINATED" for r in grid), [(r.status, r.error) for r in grid]
assert all(len(r.metrics_history) == 5 for r in grid), [len(r.metrics_history) for r in grid]
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["v2", "tuner", "both"], default="both")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    kinds = ["v2", "tuner"] if a.kind == "both" else [a.kind]
    times = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "sweep.py")
        with open(script, "w") as f:
            f.write(SWEEP)
        for rep in range(a.reps):
            for kind in kinds:  # interleaved
                storage = os.path.join(tmp, f"{kind}-{rep}")
                t0 = time.perf_counter()
                subprocess.run([sys.executable, script, storage, kind], check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                times[kind].append(time.perf_counter() - t0)
    for kind, ts in times.items():
        ts.sort()
        print(f"{kind}: median {ts[len(ts) // 2]:.2f} s, min {ts[0]:.2f} s over {len(ts)} runs ({', '.join(f'{t:.2f}' for t in ts)})")


if __name__ == "__main__":
    main()
