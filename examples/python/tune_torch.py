"""The Ray Train + Tune pattern (a TorchTrainer with 2 DDP workers inside a
Tuner with ASHA, checkpoints saved to a temporary directory and reported
with Checkpoint.from_directory, the best checkpoint loaded at the end),
with only its imports changed:

    from ray import train, tune                 ->  from nestor import train, tune
    from ray.train import Checkpoint, ...       ->  from nestor.train import Checkpoint, ...
    from ray.train.torch import TorchTrainer    ->  from nestor.train.torch import TorchTrainer
    from ray.tune.schedulers import ASHAScheduler -> from nestor.tune.schedulers import ASHAScheduler

    pip install ./python torch && python examples/python/tune_torch.py
"""

import os
import tempfile

import torch
import torch.nn as nn

import nestor.train.torch
from nestor import train, tune
from nestor.train import Checkpoint, RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer
from nestor.tune.schedulers import ASHAScheduler


def make_data(n=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.arange(1.0, 9.0)
    y = (x @ w + 0.1 * torch.randn(n, generator=g)).unsqueeze(1)
    return torch.utils.data.TensorDataset(x, y)


def train_func(config):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 1))
    model = nestor.train.torch.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loader = torch.utils.data.DataLoader(make_data(), batch_size=32, shuffle=True)
    loader = nestor.train.torch.prepare_data_loader(loader)
    val = make_data(128, seed=1)

    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"))
            model.module.load_state_dict(state["model"]) if hasattr(model, "module") else model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = state["epoch"]

    for epoch in range(start, config["epochs"]):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val_loss = nn.functional.mse_loss(model(val.tensors[0]), val.tensors[1]).item()
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                inner = model.module if hasattr(model, "module") else model
                torch.save({"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
                           os.path.join(d, "model.pt"))
                checkpoint = Checkpoint.from_directory(d)
            workers = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            train.report({"val_loss": val_loss, "epoch": epoch + 1, "workers": workers}, checkpoint=checkpoint)


if os.environ.get("EXAMPLE_SLURM_JOBS"):
    # On a Slurm login node: each trial run a Slurm job of its own (the storage must be on a shared file system).
    import nestor

    nestor.init(cluster=nestor.SlurmJobs(max_jobs=4, poll_s=float(os.environ.get("EXAMPLE_SLURM_JOBS")), signal_s=60))

trainer = TorchTrainer(
    train_func,
    train_loop_config={"epochs": 6, "hidden": 16},
    scaling_config=ScalingConfig(
        num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5},
        placement_strategy=os.environ.get("EXAMPLE_PLACEMENT", "PACK"),
    ),
)
tuner = tune.Tuner(
    trainer,
    param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 3e-2), "hidden": tune.choice([8, 32])}},
    tune_config=tune.TuneConfig(
        metric="val_loss", mode="min", num_samples=int(os.environ.get("EXAMPLE_SAMPLES", "4")),
        scheduler=ASHAScheduler(max_t=6, grace_period=2, reduction_factor=2),
    ),
    run_config=RunConfig(name=os.environ.get("EXAMPLE_NAME", "tune-torch"), storage_path=os.environ.get("EXAMPLE_STORAGE")),
)
results = tuner.fit()
best = results.get_best_result()
print(f"best config: {best.config}")
print(f"best val_loss: {best.metrics['val_loss']:.4f}")
with best.checkpoint.as_directory() as d:
    state = torch.load(os.path.join(d, "model.pt"))
    print(f"best checkpoint: {best.checkpoint.path} (epoch {state['epoch']})")
