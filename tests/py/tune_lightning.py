"""Ray Tune's Lightning pattern, without TorchTrainer: a function trainable
whose Lightning Trainer reports through
``nestor.tune.integration.pytorch_lightning.TuneReportCheckpointCallback``,
2 trials of 6 epochs under ASHA(max_t=2).

Usage: tune_lightning.py STORAGE
Prints RESULT <json> a trial, and each trial's rank 0 log has RANK lines.
"""

import json
import os
import sys

import lightning.pytorch as pl
import torch

from nestor import tune
from nestor.tune.integration.pytorch_lightning import TuneReportCheckpointCallback
from nestor.tune.schedulers import ASHAScheduler

from fw_models import lightning_regressor, make_data


Regressor = lightning_regressor(pl)


def train_fn(config):
    pl.seed_everything(0)
    trainer = pl.Trainer(max_epochs=6, accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                         logger=False, enable_checkpointing=False,
                         callbacks=[TuneReportCheckpointCallback({"loss": "val_loss"}, filename="model.ckpt", on="validation_end")])
    loaders = (torch.utils.data.DataLoader(make_data(256, 0), batch_size=32), torch.utils.data.DataLoader(make_data(64, 1), batch_size=64))
    trainer.fit(Regressor(config["lr"]), *loaders)
    print("RANK " + json.dumps({"ended_at_epoch": trainer.current_epoch}), flush=True)


grid = tune.Tuner(
    train_fn,
    param_space={"lr": tune.grid_search([5e-3, 1e-2])},
    tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=ASHAScheduler(max_t=2, grace_period=1)),
    run_config=tune.RunConfig(name="tune-lightning", storage_path=sys.argv[1]),
).fit()
best = grid.get_best_result()
with best.checkpoint.as_directory() as d:
    model = Regressor.load_from_checkpoint(os.path.join(d, "model.ckpt"))
for result in grid:
    print("RESULT " + json.dumps({"iterations": [int(h["training_iteration"]) for h in result.metrics_history],
                                  "losses": [h.get("loss") for h in result.metrics_history],
                                  "best_lr": model.hparams.lr}), flush=True)
