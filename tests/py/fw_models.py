"""The small models and data the framework tests train (tests/py/frameworks.py,
tests/py/tune_lightning.py): nothing downloaded, everything seeded."""

import os
import time

import torch
from torch import nn

#: The Hugging Face model's vocabulary and sequence length.
VOCAB, LENGTH = 64, 16


class Sequences(torch.utils.data.Dataset):
    """Token ids that count up from a random start (mod VOCAB)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = (torch.randint(0, VOCAB, (n, 1), generator=g) + torch.arange(LENGTH)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_data(n, seed):
    """A noisy linear regression of 8 features."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x @ torch.arange(1.0, 9.0) + 0.1 * torch.randn(n, generator=g)).unsqueeze(1)
    return torch.utils.data.TensorDataset(x, y)


def lightning_regressor(pl):
    """A LightningModule class for ``pl`` (``lightning.pytorch`` or
    ``pytorch_lightning``); each training step sleeps ``$SLOW_S``."""

    class Regressor(pl.LightningModule):
        def __init__(self, lr=1e-2):
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            time.sleep(float(os.environ.get("SLOW_S", "0")))
            loss = nn.functional.mse_loss(self(batch[0]), batch[1])
            self.log("train_loss", loss, sync_dist=True)
            return loss

        def validation_step(self, batch, _):
            self.log("val_loss", nn.functional.mse_loss(self(batch[0]), batch[1]), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Regressor
