"""XGBoost and LightGBM across 2 ranks: the wall time of a whole run (the
process started to its end, interpreter and imports included) under
nestor's XGBoostTrainer / LightGBMTrainer, against the same training run by
hand as 2 processes in the framework's own collective (XGBoost's tracker
started by the parent; LightGBM's machine list of 2 local ports), and
against Ray Train's trainers (``--ray``, with ``ray[train]`` importable by
``--ray-python``).

    VENV=$(examples/torch_ddp/venv.sh)
    cargo build --release -p nestor-cli
    NESTOR_BIN=target/release/nestor "$VENV/bin/python" python/benches/trees.py --framework xgboost [--reps 3] [--ray]

The data: 200,000 rows of 20 features and a label, generated from a seed,
each rank its half; 40 boosting rounds of depth-6 trees, a report every round.

``--sweep N``: a whole sweep instead, N XGBoost trials of 2 ranks each under
ASHA in boosting rounds (20 rounds at most, 20,000 rows), 2 trials at a time,
a Tuner over the trainer, the same script under nestor and (``--ray``)
under Ray Tune + Ray Train:

    NESTOR_BIN=target/release/nestor "$VENV/bin/python" python/benches/trees.py --sweep 64 --ray --ray-python "$RAY_VENV/bin/python"
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
ROWS, FEATURES, ROUNDS = 200_000, 20, 40


def rows(rank, world):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    y = (x[:, :5].sum(axis=1) + 0.5 * rng.standard_normal(ROWS) > 0).astype(np.float32)
    return x[rank::world], y[rank::world]


def xgb_train(rank, world, callbacks):
    import xgboost

    x, y = rows(rank, world)
    d = xgboost.DMatrix(x, label=y)
    return xgboost.train({"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 6, "tree_method": "hist",
                          "nthread": 1}, d, num_boost_round=ROUNDS, evals=[(d, "train")], callbacks=callbacks)


def lgb_train(rank, world, network, callbacks):
    import lightgbm

    x, y = rows(rank, world)
    params = {"objective": "binary", "metric": "binary_logloss", "num_leaves": 63, "tree_learner": "data", "verbose": -1,
              "num_threads": 1, **network}
    d = lightgbm.Dataset(x, label=y)
    return lightgbm.train(params, d, num_boost_round=ROUNDS, valid_sets=[d], valid_names=["train"], callbacks=callbacks)


def loop(config):
    side, framework = config["side"], config["framework"]
    if side == "ray":
        from ray import train
    else:
        from nestor import train
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if framework == "xgboost":
        if side == "ray":
            from ray.train.xgboost import RayTrainReportCallback
        else:
            from nestor.train.xgboost import RayTrainReportCallback
        xgb_train(rank, world, [RayTrainReportCallback()])
    else:
        if side == "ray":
            from ray.train.lightgbm import RayTrainReportCallback, get_network_params
        else:
            from nestor.train.lightgbm import RayTrainReportCallback, get_network_params
        lgb_train(rank, world, get_network_params(), [RayTrainReportCallback()])


def one_run(framework, side, storage):
    """A whole run as a user's script makes it (this process)."""
    config = {"side": side, "framework": framework}
    if side == "ray":
        import ray
        from ray.train import RunConfig, ScalingConfig

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        if framework == "xgboost":
            from ray.train.xgboost import XGBoostTrainer as Trainer
        else:
            from ray.train.lightgbm import LightGBMTrainer as Trainer
    else:
        from nestor.train import RunConfig, ScalingConfig

        if framework == "xgboost":
            from nestor.train.xgboost import XGBoostTrainer as Trainer
        else:
            from nestor.train.lightgbm import LightGBMTrainer as Trainer
    Trainer(loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="bench", storage_path=storage)).fit()


SWEEP_ROWS, SWEEP_ROUNDS = 20_000, 20


def sweep_loop(config):
    """One trial's rank: XGBoost on its half of the sweep's rows."""
    import numpy as np
    import xgboost

    if config["side"] == "ray":
        from ray import train
        from ray.train.xgboost import RayTrainReportCallback
    else:
        from nestor import train
        from nestor.train.xgboost import RayTrainReportCallback
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((SWEEP_ROWS, 10)).astype(np.float32)
    y = (x[:, :4].sum(axis=1) + rng.standard_normal(SWEEP_ROWS) > 0).astype(np.float32)
    dtrain = xgboost.DMatrix(x[rank::world], label=y[rank::world])
    params = {"objective": "binary:logistic", "eval_metric": "logloss", "tree_method": "hist", "nthread": 1,
              "eta": config["eta"], "max_depth": config["max_depth"]}
    xgboost.train(params, dtrain, num_boost_round=SWEEP_ROUNDS, evals=[(dtrain, "train")], verbose_eval=False,
                  callbacks=[RayTrainReportCallback(frequency=0, checkpoint_at_end=False)])


def one_sweep(side, trials, storage):
    """A whole sweep as a user's script makes it (this process): a Tuner
    over the trainer, its ``train_loop_config`` the space (Ray Train V1's
    form: under Ray 2.60's V2 form, a Tune function calling ``fit()``, the
    trials after the first 2 never got their workers here, and the sweep
    waited)."""
    if side == "ray":
        os.environ["RAY_TRAIN_V2_ENABLED"] = "0"
        import ray
        from ray import tune
        from ray.train import RunConfig, ScalingConfig
        from ray.train.xgboost import XGBoostTrainer
        from ray.tune.schedulers import ASHAScheduler

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    else:
        from nestor import tune
        from nestor.train import RunConfig, ScalingConfig
        from nestor.train.xgboost import XGBoostTrainer
        from nestor.tune.schedulers import ASHAScheduler

    trainer = XGBoostTrainer(sweep_loop, train_loop_config={"side": side},
                             scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}))
    space = {"train_loop_config": {"side": side, "eta": tune.loguniform(0.01, 0.5), "max_depth": tune.randint(2, 9)}}
    grid = tune.Tuner(trainer, param_space=space,
                      tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=2, metric="train-logloss", mode="min",
                                                  scheduler=ASHAScheduler(max_t=SWEEP_ROUNDS, grace_period=2, reduction_factor=3)),
                      run_config=RunConfig(name="sweep", storage_path=storage)).fit()
    rounds = sorted(r.metrics.get("training_iteration", 0) for r in grid)
    errors = sum(r.error is not None for r in grid)
    print(f"SWEEP {json.dumps({'trials': len(rounds), 'errors': errors, 'rounds': sum(rounds), 'best': grid.get_best_result().metrics['train-logloss']})}")


def timed_sweep(side, python, trials):
    with tempfile.TemporaryDirectory() as d:
        started = time.time()
        out = subprocess.run([python, HERE, "--one-sweep", side, str(trials), os.path.join(d, "runs")], cwd=d,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        took = time.time() - started
        if out.returncode != 0:
            sys.exit(f"{side} failed:\n{out.stdout[-3000:]}")
        summary = next((line for line in out.stdout.splitlines() if line.startswith("SWEEP ")), "SWEEP {}")
        return took, json.loads(summary[6:])


def hand_rank(framework, rank, args):
    """One rank by hand, in the framework's own collective."""
    if framework == "xgboost":
        import xgboost

        with xgboost.collective.CommunicatorContext(**json.loads(args), dmlc_task_id=f"rank-{rank}"):
            xgb_train(rank, 2, [])
    else:
        ports = [int(p) for p in args.split(",")]
        network = {"num_machines": 2, "local_listen_port": ports[rank], "machines": ",".join(f"127.0.0.1:{p}" for p in ports)}
        lgb_train(rank, 2, network, [])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hand(framework, python):
    """Both ranks started by hand from this process (the parent holds XGBoost's tracker)."""
    if framework == "xgboost":
        from xgboost.tracker import RabitTracker

        tracker = RabitTracker(n_workers=2, host_ip="127.0.0.1", sortby="task")
        tracker.start()
        args = json.dumps(tracker.worker_args())
    else:
        args = f"{free_port()},{free_port()}"
    procs = [subprocess.Popen([python, HERE, "--rank", framework, str(r), args]) for r in range(2)]
    codes = [p.wait() for p in procs]
    if framework == "xgboost":
        tracker.wait_for(10)
        tracker.free()
    assert codes == [0, 0], codes


def timed(framework, side, python):
    with tempfile.TemporaryDirectory() as d:
        started = time.time()
        if side == "hand":
            cmd = [python, HERE, "--hand", framework]
        else:
            cmd = [python, HERE, "--run", framework, side, os.path.join(d, "runs")]
        out = subprocess.run(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        took = time.time() - started
        if out.returncode != 0:
            sys.exit(f"{side} failed:\n{out.stdout[-3000:]}")
        return took


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        return hand_rank(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    if len(sys.argv) > 1 and sys.argv[1] == "--hand":
        return hand(sys.argv[2], sys.executable)
    if len(sys.argv) > 1 and sys.argv[1] == "--run":
        return one_run(sys.argv[2], sys.argv[3], sys.argv[4])
    if len(sys.argv) > 1 and sys.argv[1] == "--one-sweep":
        return one_sweep(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=["xgboost", "lightgbm"], default="xgboost")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ray", action="store_true", help="also Ray Train (ray[train] importable by --ray-python)")
    ap.add_argument("--ray-python", default=sys.executable)
    ap.add_argument("--sweep", type=int, default=0, help="a sweep of this many XGBoost trials under ASHA instead")
    a = ap.parse_args()
    if a.sweep:
        print(f"a sweep of {a.sweep} XGBoost trials x 2 ranks under ASHA (<= {SWEEP_ROUNDS} rounds, {SWEEP_ROWS:,} rows), "
              f"2 at a time; whole process, {a.reps} run(s) each")
        for side, python in [("nestor", sys.executable)] + ([("ray", a.ray_python)] if a.ray else []):
            for _ in range(a.reps):
                took, summary = timed_sweep(side, python, a.sweep)
                print(f"{side:>7}: {took:.1f} s  {json.dumps(summary)}", flush=True)
        return
    sides = [("nestor", sys.executable), ("hand", sys.executable)] + ([("ray", a.ray_python)] if a.ray else [])
    print(f"{a.framework}: 2 ranks, {ROWS:,} rows x {FEATURES} features, {ROUNDS} rounds; whole process, {a.reps} runs each")
    for side, python in sides:
        times = [timed(a.framework, side, python) for _ in range(a.reps)]
        print(f"{side:>7}: median {statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f})", flush=True)


if __name__ == "__main__":
    main()
