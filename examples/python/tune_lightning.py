"""Ray Train's Lightning pattern (a Lightning Trainer inside a TorchTrainer's
training function with RayDDPStrategy, RayLightningEnvironment,
RayTrainReportCallback and prepare_trainer), swept by a Tuner with ASHA,
with only its imports changed:

    from ray import train, tune                      ->  from nestor import train, tune
    from ray.train.lightning import ...              ->  from nestor.train.lightning import ...
    from ray.train.torch import TorchTrainer         ->  from nestor.train.torch import TorchTrainer

Each trial fits a small regression network on 2 workers (DDP on gloo);
the best checkpoint loads with LightningModule.load_from_checkpoint.

    pip install "./python[lightning]" && python examples/python/tune_lightning.py
"""

import os

import lightning.pytorch as pl
import torch
from torch import nn

from nestor import train, tune
from nestor.train import RunConfig, ScalingConfig
from nestor.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
from nestor.train.torch import TorchTrainer
from nestor.tune.schedulers import ASHAScheduler


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x @ torch.arange(1.0, 9.0) + 0.1 * torch.randn(n, generator=g)).unsqueeze(1)
    return torch.utils.data.TensorDataset(x, y)


class Regressor(pl.LightningModule):
    def __init__(self, hidden=16, lr=1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def train_func(config):
    pl.seed_everything(0)
    model = Regressor(config["hidden"], config["lr"])
    train_loader = torch.utils.data.DataLoader(make_data(512, 0), batch_size=32, shuffle=True)
    val_loader = torch.utils.data.DataLoader(make_data(128, 1), batch_size=64)
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer = prepare_trainer(trainer)
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            trainer.fit(model, train_loader, val_loader, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    else:
        trainer.fit(model, train_loader, val_loader)


trainer = TorchTrainer(
    train_func,
    train_loop_config={"epochs": 6, "hidden": 16},
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
)
tuner = tune.Tuner(
    trainer,
    param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 3e-2), "hidden": tune.choice([8, 32])}},
    tune_config=tune.TuneConfig(
        metric="val_loss", mode="min", num_samples=int(os.environ.get("EXAMPLE_SAMPLES", "4")),
        scheduler=ASHAScheduler(max_t=6, grace_period=2, reduction_factor=2),
    ),
    run_config=RunConfig(name=os.environ.get("EXAMPLE_NAME", "tune-lightning"), storage_path=os.environ.get("EXAMPLE_STORAGE")),
)
results = tuner.fit()
best = results.get_best_result()
print(f"best config: {best.config}")
print(f"best val_loss: {best.metrics['val_loss']:.4f} at epoch {best.metrics['epoch']:.0f}")
with best.checkpoint.as_directory() as d:
    model = Regressor.load_from_checkpoint(os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    print(f"best checkpoint: {best.checkpoint.path} (hidden={model.hparams.hidden})")
