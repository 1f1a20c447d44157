"""A Hugging Face Accelerate training loop inside Ray Train's TorchTrainer,
swept by a Tuner with ASHA, with only its imports changed:

    from ray import train, tune                 ->  from nestor import train, tune
    from ray.train.torch import TorchTrainer    ->  from nestor.train.torch import TorchTrainer

Accelerator() reads the trial's ranks from the environment nestor sets and
uses the process group that is already up: accelerator.prepare wraps the
model in DDP and shards the DataLoader over the 2 workers.

    pip install "./python[accelerate]" && python examples/python/tune_accelerate.py
"""

import os
import tempfile

import torch
from accelerate import Accelerator
from torch import nn

from nestor import train, tune
from nestor.train import Checkpoint, RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer
from nestor.tune.schedulers import ASHAScheduler


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ torch.arange(1.0, 9.0) + 0.1 * torch.randn(n, generator=g)).unsqueeze(1))


def train_func(config):
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loader = torch.utils.data.DataLoader(make_data(512, 0), batch_size=32, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    val = make_data(128, 1)

    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            accelerator.load_state(d)
            start = int(open(os.path.join(d, "epoch")).read())

    for epoch in range(start, config["epochs"]):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
        with torch.no_grad():
            val_loss = nn.functional.mse_loss(accelerator.unwrap_model(model)(val.tensors[0]), val.tensors[1]).item()
        with tempfile.TemporaryDirectory() as d:
            accelerator.save_state(d)  # on the main process; each rank's random state beside it
            if accelerator.is_main_process:
                with open(os.path.join(d, "epoch"), "w") as f:
                    f.write(str(epoch + 1))
            train.report({"val_loss": val_loss, "epoch": epoch + 1, "processes": accelerator.num_processes},
                         checkpoint=Checkpoint.from_directory(d))


trainer = TorchTrainer(
    train_func,
    train_loop_config={"epochs": 6},
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
)
tuner = tune.Tuner(
    trainer,
    param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 3e-2), "hidden": tune.choice([8, 32])}},
    tune_config=tune.TuneConfig(
        metric="val_loss", mode="min", num_samples=int(os.environ.get("EXAMPLE_SAMPLES", "4")),
        scheduler=ASHAScheduler(max_t=6, grace_period=2, reduction_factor=2),
    ),
    run_config=RunConfig(name=os.environ.get("EXAMPLE_NAME", "tune-accelerate"), storage_path=os.environ.get("EXAMPLE_STORAGE")),
)
results = tuner.fit()
best = results.get_best_result()
print(f"best config: {best.config}")
print(f"best val_loss: {best.metrics['val_loss']:.4f} at epoch {best.metrics['epoch']:.0f} on {best.metrics['processes']:.0f} processes")
with best.checkpoint.as_directory() as d:
    print(f"best checkpoint: {best.checkpoint.path} ({', '.join(sorted(os.listdir(d)))})")
