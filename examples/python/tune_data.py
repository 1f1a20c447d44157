"""Ray Train's data pattern (TorchTrainer(datasets=...), get_dataset_shard,
iter_torch_batches), swept by a Tuner with ASHA, with only its imports changed:

    from ray import data, train, tune           ->  from nestor import data, train, tune
    from ray.train import DataConfig, ...       ->  from nestor.train import DataConfig, ...
    from ray.train.torch import TorchTrainer    ->  from nestor.train.torch import TorchTrainer

The script writes a regression data set as Parquet files (uneven sizes, on
purpose); each trial's 2 workers read their shares of "train" (the same
number of rows each, a new order every epoch) and the whole of "valid".

    pip install "./python[torch,data]" && python examples/python/tune_data.py
"""

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import nestor.train.torch
from nestor import data, train, tune
from nestor.train import DataConfig, RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer
from nestor.tune.schedulers import ASHAScheduler


def write_files(folder, sizes, seed):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for i, n in enumerate(sizes):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        y = x @ np.arange(1, 9, dtype=np.float32) + 0.1 * rng.standard_normal(n).astype(np.float32)
        pq.write_table(pa.table({**{f"x{j}": x[:, j] for j in range(8)}, "y": y}), os.path.join(folder, f"part-{i}.parquet"),
                       row_group_size=256)
    return folder


def features(batch):
    return torch.stack([batch[f"x{j}"] for j in range(8)], dim=1), batch["y"].unsqueeze(1)


def train_func(config):
    torch.manual_seed(0)
    model = nestor.train.torch.prepare_model(nn.Sequential(nn.Linear(8, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    train_shard, valid_shard = train.get_dataset_shard("train"), train.get_dataset_shard("valid")
    for epoch in range(config["epochs"]):
        for batch in train_shard.iter_torch_batches(batch_size=32, dtypes=torch.float32):
            x, y = features(batch)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            losses = [nn.functional.mse_loss(model(x), y, reduction="sum").item()
                      for x, y in map(features, valid_shard.iter_torch_batches(batch_size=256, dtypes=torch.float32))]
        train.report({"val_loss": sum(losses) / valid_shard.count(), "epoch": epoch + 1, "rows": train_shard.count()})


folder = tempfile.mkdtemp(prefix="nestor-example-data-")
train_ds = data.read_parquet(write_files(os.path.join(folder, "train"), [700, 250, 83], seed=0)).random_shuffle(seed=0)
valid_ds = data.read_parquet(write_files(os.path.join(folder, "valid"), [128], seed=1))
trainer = TorchTrainer(
    train_func,
    train_loop_config={"epochs": 6, "hidden": 16},
    datasets={"train": train_ds, "valid": valid_ds},
    dataset_config=DataConfig(datasets_to_split=["train"]),
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
)
tuner = tune.Tuner(
    trainer,
    param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 3e-2), "hidden": tune.choice([8, 32])}},
    tune_config=tune.TuneConfig(
        metric="val_loss", mode="min", num_samples=int(os.environ.get("EXAMPLE_SAMPLES", "4")),
        scheduler=ASHAScheduler(max_t=6, grace_period=2, reduction_factor=2),
    ),
    run_config=RunConfig(name=os.environ.get("EXAMPLE_NAME", "tune-data"), storage_path=os.environ.get("EXAMPLE_STORAGE")),
)
results = tuner.fit()
best = results.get_best_result()
print(f"best config: {best.config}")
print(f"best val_loss: {best.metrics['val_loss']:.4f} at epoch {best.metrics['epoch']:.0f}, "
      f"{best.metrics['rows']:.0f} training rows a worker an epoch")
shutil.rmtree(folder)
