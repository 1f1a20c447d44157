"""Ray's behaviours where a script relies on them without saying so.

Usage: ray_behaviours.py STORAGE SCENARIO

  done      a result with done=True ends its trial (with and without stop={"done": True})
  home      storage_path="~/..." is the home directory, for the driver and the binary alike
  keep      CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=...) keeps the best and the latest
  torch     TorchTrainer: the process group is up before the training function runs (1 and 2 workers),
            which calls torch.distributed itself and shards its model with FSDP's fully_shard
  init      init(num_cpus=1): one trial at a time, each reporting when it ran
  errored   a trial fails on its first run; Tuner.restore(resume_errored=True) / (restart_errored=True)
  scaling   a ScalingConfig inside param_space: each trial its own number of workers (1, 2; 5 cannot fit)
"""

import json
import os
import sys
import tempfile

from nestor import train, tune


def counting(config):
    for step in range(1, 11):
        train.report({"score": float(step), "done": step >= config["done_at"]})


def peaked(config):
    # Scores 1, 2, 3, 2, 1, 0: the best checkpoint is step 3's, the latest step 6's.
    for step in range(1, 7):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            train.report({"score": float(3 - abs(3 - step))}, checkpoint=train.Checkpoint.from_directory(d))


def collective(config):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    # No prepare_model, no init_process_group: the group is already there.
    assert dist.is_initialized(), "no process group before the training function"
    ctx = train.get_context()
    t = torch.tensor([float(ctx.get_world_rank() + 1)])
    dist.all_reduce(t)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(3):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        train.report({"sum": t.item(), "loss": loss.item(), "world": float(dist.get_world_size()),
                      "backend": dist.get_backend()})


def sized(config):
    ctx = train.get_context()
    train.report({"world": float(ctx.get_world_size()), "lr": config["lr"]})


def spans(config):
    import time

    start = time.time()
    time.sleep(0.3)
    train.report({"start": start, "end": time.time()})


def flaky(config):
    """Fails at step 3 of its first run (a marker file says it has); checkpoints every step."""
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read())
    marker = os.path.join(config["dir"], "failed-once")
    for step in range(start + 1, 6):
        if step == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("a failure the restore gets past")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            train.report({"score": float(step), "start": float(start)}, checkpoint=train.Checkpoint.from_directory(d))


def dump(grid):
    out = {}
    for r in grid:
        out[r.trial_id] = {
            "status": r.status, "config": r.config, "error": str(r.error) if r.error else None,
            "history": [{k: v for k, v in h.items()
                         if k in ("training_iteration", "score", "done", "sum", "world", "loss", "backend", "start")}
                        for h in r.metrics_history],
            "checkpoints": [c.path for c, _ in r.best_checkpoints],
            "latest": r.checkpoint.path if r.checkpoint else None,
        }
    return out


def main():
    storage, scenario = sys.argv[1], sys.argv[2]
    if scenario == "done":
        for stop, name in ((None, "done-plain"), ({"done": True}, "done-stop")):
            grid = tune.Tuner(counting, param_space={"done_at": tune.grid_search([3, 20])},
                              tune_config=tune.TuneConfig(metric="score", mode="max"),
                              run_config=tune.RunConfig(name=name, storage_path=storage, stop=stop)).fit()
            print(name.upper(), json.dumps(dump(grid)))
    elif scenario == "home":
        grid = tune.Tuner(counting, param_space={"done_at": 2},
                          run_config=tune.RunConfig(name="tilde", storage_path="~/tilde-runs")).fit()
        print("HOME", json.dumps({"path": grid.experiment_path, "trials": dump(grid)}))
    elif scenario == "init":
        import nestor

        nestor.init(num_cpus=1)
        grid = tune.Tuner(spans, param_space={"i": tune.grid_search([0, 1, 2])},
                          run_config=tune.RunConfig(name="init", storage_path=storage)).fit()
        print("INIT", json.dumps([[r.metrics["start"], r.metrics["end"]] for r in grid]))
    elif scenario in ("errored-resume", "errored-restart"):
        name = scenario
        marks = os.path.join(storage, f"{name}-marks")
        os.makedirs(marks, exist_ok=True)
        grid = tune.Tuner(flaky, param_space={"dir": marks}, tune_config=tune.TuneConfig(metric="score", mode="max"),
                          run_config=tune.RunConfig(name=name, storage_path=storage)).fit()
        first = dump(grid)
        path = os.path.join(storage, name)
        flag = {"resume_errored": True} if scenario == "errored-resume" else {"restart_errored": True}
        grid = tune.Tuner.restore(path, flaky, **flag).fit()
        print("ERRORED", json.dumps({"first": first, "then": dump(grid)}))
    elif scenario == "keep":
        grid = tune.Tuner(peaked, tune_config=tune.TuneConfig(metric="score", mode="max"),
                          run_config=tune.RunConfig(name="keep", storage_path=storage, checkpoint_config=train.CheckpointConfig(
                              num_to_keep=1, checkpoint_score_attribute="score", checkpoint_score_order="max"))).fit()
        r = grid[0]
        best = r.get_best_checkpoint("score", "max")
        with best.as_directory() as d:
            best_step = open(os.path.join(d, "step")).read()
        with r.checkpoint.as_directory() as d:
            latest_step = open(os.path.join(d, "step")).read()
        print("KEEP", json.dumps({"trials": dump(grid), "best_step": best_step, "latest_step": latest_step}))
    elif scenario == "torch":
        from nestor.train.torch import TorchConfig, TorchTrainer

        for workers in (1, 2):
            result = TorchTrainer(collective, torch_config=TorchConfig(backend="gloo", timeout_s=120),
                                  scaling_config=train.ScalingConfig(num_workers=workers),
                                  run_config=train.RunConfig(name=f"torch-{workers}", storage_path=storage)).fit()
            print(f"TORCH{workers}", json.dumps(result.metrics_history))
    elif scenario == "scaling":
        from nestor.train.torch import TorchTrainer

        trainer = TorchTrainer(sized, scaling_config=train.ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}))
        grid = tune.Tuner(trainer, param_space={
            "scaling_config": train.ScalingConfig(num_workers=tune.grid_search([1, 2, 5])),
            "train_loop_config": {"lr": tune.grid_search([0.1, 0.01])},
        }, run_config=tune.RunConfig(name="scaling", storage_path=storage)).fit()
        print("SCALING", json.dumps(dump(grid)))
    else:
        raise SystemExit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main()
