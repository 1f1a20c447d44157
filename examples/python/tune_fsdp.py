"""FSDP through Ray Train's prepare_model(parallel_strategy="fsdp"), with a
sharded checkpoint (each rank saves its part with torch.distributed.checkpoint
and reports it), swept by a Tuner with ASHA, with only its imports changed:

    from ray import train, tune                 ->  from nestor import train, tune
    from ray.train.torch import TorchTrainer    ->  from nestor.train.torch import TorchTrainer

Each trial shards a small network over 2 workers (on CPUs: fully_shard over
gloo; on GPUs: FullyShardedDataParallel). The best checkpoint, every rank's
part of it, loads into a plain model in the driver.

    pip install "./python[torch]" && python examples/python/tune_fsdp.py
"""

import os
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import nestor.train.torch
from nestor import train, tune
from nestor.train import Checkpoint, RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer
from nestor.tune.schedulers import ASHAScheduler


def make_model(hidden):
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ torch.arange(1.0, 9.0) + 0.1 * torch.randn(n, generator=g)).unsqueeze(1))


def train_func(config):
    torch.manual_seed(0)
    model = nestor.train.torch.prepare_model(make_model(config["hidden"]), parallel_strategy="fsdp")
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loader = nestor.train.torch.prepare_data_loader(torch.utils.data.DataLoader(make_data(512, 0), batch_size=32, shuffle=True))
    val = make_data(128, 1)

    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:  # every rank's part
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=d)
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            start = int(open(os.path.join(d, "epoch")).read())

    for epoch in range(start, config["epochs"]):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            val_loss = nn.functional.mse_loss(model(val.tensors[0]), val.tensors[1]).item()
        with tempfile.TemporaryDirectory() as d:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=d)  # this rank's shard
            if train.get_context().get_world_rank() == 0:
                with open(os.path.join(d, "epoch"), "w") as f:
                    f.write(str(epoch + 1))
            train.report({"val_loss": val_loss, "epoch": epoch + 1}, checkpoint=Checkpoint.from_directory(d))


trainer = TorchTrainer(
    train_func,
    train_loop_config={"epochs": 6},
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
)
tuner = tune.Tuner(
    trainer,
    param_space={"train_loop_config": {"lr": tune.loguniform(1e-3, 3e-2), "hidden": tune.choice([32, 64])}},
    tune_config=tune.TuneConfig(
        metric="val_loss", mode="min", num_samples=int(os.environ.get("EXAMPLE_SAMPLES", "4")),
        scheduler=ASHAScheduler(max_t=6, grace_period=2, reduction_factor=2),
    ),
    run_config=RunConfig(name=os.environ.get("EXAMPLE_NAME", "tune-fsdp"), storage_path=os.environ.get("EXAMPLE_STORAGE")),
)
results = tuner.fit()
best = results.get_best_result()
print(f"best config: {best.config}")
print(f"best val_loss: {best.metrics['val_loss']:.4f} at epoch {best.metrics['epoch']:.0f}")
model = make_model(best.config["train_loop_config"]["hidden"])
with best.checkpoint.as_directory() as d:
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=d)  # no process group here: the shards loaded into one whole model
    model.load_state_dict(state["model"])
val = make_data(128, 1)
with torch.no_grad():
    loss = nn.functional.mse_loss(model(val.tensors[0]), val.tensors[1]).item()
print(f"best checkpoint: {best.checkpoint.path} (val_loss {loss:.4f} from the whole model)")
