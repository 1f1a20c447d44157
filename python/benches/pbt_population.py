"""Benchmark: asynchronous PBT with more members than slots, on nestor or on
Ray Tune, the same script with its imports changed. The shape of Ray's PBT
function example (written here anew): a toy model whose best learning rate
rises then falls as its accuracy grows, so only a population that keeps
copying its best members' weights and perturbing their learning rates gets
far; 8 members on 2 CPUs, a perturbation every 4 iterations, a checkpoint
every 4, 200 iterations or accuracy above 200 (``done``). Every member must
take part: a scheduler that lets the first two run on while the others wait
ends with most of the population near where it started.

    python python/benches/pbt_population.py [--framework nestor|ray] [--seeds 3] [--iterations 200]

Prints each seed's final accuracies, sorted, and their spread.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = r'''
import json, os, random, sys, tempfile
import numpy as np

if FRAMEWORK == "ray":
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining
else:
    import nestor as ray
    from nestor import tune
    from nestor.tune.schedulers import PopulationBasedTraining


def member(config):
    random.seed(config["seed"] * 1000 + int(config["lr"] * 1e6) % 1000)
    accuracy, step = 0.0, 0
    ckpt = tune.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                state = json.load(f)
        accuracy, step = state["accuracy"], state["step"]
    lr = config["lr"]
    while True:
        step += 1
        # The best rate climbs from 0.001 to 0.01 as accuracy reaches 100, then falls back.
        best = 0.01 * accuracy / 100 if accuracy < 100 else 0.01 - 0.01 * (accuracy - 100) / 100
        best = min(0.01, max(0.001, best))
        ratio = max(lr, best) / min(lr, best)
        if ratio < 3:
            accuracy += random.random() / ratio
        elif lr > best:
            accuracy -= (ratio - 3) * random.random()
        accuracy = max(0.0, accuracy + 2 * np.random.normal())
        metrics = {"mean_accuracy": accuracy, "lr": lr, "done": accuracy > 200}
        if step % 4 == 0:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"accuracy": accuracy, "step": step}, f)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(metrics)


ray.init(num_cpus=2)
np.random.seed(SEED)
random.seed(SEED)
pbt = PopulationBasedTraining(
    time_attr="training_iteration",
    perturbation_interval=4,
    hyperparam_mutations={"lr": tune.uniform(0.0001, 0.02)},
)
grid = tune.Tuner(
    member,
    param_space={"lr": tune.uniform(0.0001, 0.02), "seed": SEED},
    tune_config=tune.TuneConfig(scheduler=pbt, metric="mean_accuracy", mode="max", num_samples=8),
    run_config=tune.RunConfig(name="pbt", storage_path=STORAGE, stop={"training_iteration": ITERATIONS}, verbose=0),
).fit()
print("FINAL", json.dumps(sorted(r.metrics["mean_accuracy"] for r in grid)))
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=["nestor", "ray"], default="nestor")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=200)
    args = ap.parse_args()
    print(f"PBT on {args.framework}: 8 members, 2 CPUs, perturbation every 4 iterations, {args.iterations} iterations")
    lows, highs = [], []
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "pbt.py")
            with open(script, "w") as f:
                f.write(SCRIPT.replace("FRAMEWORK", repr(args.framework)).replace("SEED", str(seed))
                        .replace("STORAGE", repr(os.path.join(d, "runs"))).replace("ITERATIONS", str(args.iterations)))
            out = subprocess.run([sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d)
            if out.returncode != 0:
                sys.exit(f"seed {seed} failed:\n{out.stderr[-3000:]}")
            line = next(l for l in out.stdout.splitlines() if l.startswith("FINAL "))
            final = json.loads(line[len("FINAL "):])
            lows.append(final[0])
            highs.append(final[-1])
            print(f"  seed {seed}: " + " ".join(f"{v:.0f}" for v in final))
    print(f"lowest member {min(lows):.0f}-{max(lows):.0f}, highest {min(highs):.0f}-{max(highs):.0f} over {args.seeds} seeds")


if __name__ == "__main__":
    main()
