"""Data-parallel training of a small PyTorch model under nestor.

Every rank runs this script (nestor starts one process per worker with the
torchrun variables set). The model is a two-layer perceptron fitting a
fixed, seeded regression problem; DistributedDataParallel averages the
gradients across ranks (gloo on CPU, NCCL on GPU). Rank 0 checkpoints each
epoch; a restarted or resumed trial continues from `nestor.get_checkpoint()`.

Each rank prints one line per epoch with a checksum of its parameters, so the
ranks can be seen to stay in sync:

    epoch 3 rank 1/2: train_loss=0.0412 val_loss=0.0398 param_sum=12.3456789012

Run by hand (no nestor): `python train.py` trains one worker with defaults.
"""

import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import nestor
import nestor.torch

FEATURES = 8


def make_data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = torch.sin(x @ w) + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


def param_sum(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def main(config=None) -> None:
    """Trains; `config` is the trial's (a TorchTrainer's `train_loop_config`
    when a Python driver calls this), else the run's from nestor."""
    config = {"lr": 0.01, "hidden": 32, "batch_size": 64, "epochs": 5, "seed": 0, **(nestor.get_config() if config is None else config)}
    ctx = nestor.get_context()
    torch.manual_seed(config["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, config["hidden"]), torch.nn.Tanh(), torch.nn.Linear(config["hidden"], 1))
    start_epoch, state = 0, None
    checkpoint = nestor.get_checkpoint()
    if checkpoint is not None:
        state = torch.load(os.path.join(checkpoint, "state.pt"), map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        start_epoch = state["epoch"]
        print(f"rank {ctx.world_rank}: resumed from {checkpoint} after epoch {start_epoch}", flush=True)

    model = nestor.torch.prepare_model(model)
    # The optimizer over the placed parameters; its saved state follows them to the device.
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    if dist.is_initialized():
        # Every rank adds its rank + 1: the sum shows who joined the group.
        joined = torch.tensor([float(ctx.world_rank + 1)], device=nestor.torch.get_device())  # NCCL needs it on the GPU
        dist.all_reduce(joined)
        print(f"rank {ctx.world_rank}: process group world={dist.get_world_size()} backend={dist.get_backend()} rank_sum={int(joined.item())}", flush=True)

    x, y = make_data(2048, seed=1234)
    train = DataLoader(TensorDataset(x[:1536], y[:1536]), batch_size=config["batch_size"], shuffle=True)
    train = nestor.torch.prepare_data_loader(train)
    device = nestor.torch.get_device()
    x_val, y_val = x[1536:].to(device), y[1536:].to(device)
    loss_fn = torch.nn.MSELoss()
    # Removed when training ends, a stop from the driver (SystemExit) included;
    # in the trial directory, so that even a killed rank leaves nothing outside it.
    with tempfile.TemporaryDirectory(prefix=".scratch-", dir=ctx.trial_dir) as scratch:
        for epoch in range(start_epoch + 1, config["epochs"] + 1):
            model.train()
            total, batches = 0.0, 0
            for xb, yb in train:
                optimizer.zero_grad()
                loss = loss_fn(model(xb), yb)
                loss.backward()
                optimizer.step()
                total += loss.item()
                batches += 1
            model.eval()
            with torch.no_grad():
                val_loss = loss_fn(model(x_val), y_val).item()
            train_loss = total / max(batches, 1)
            print(
                f"epoch {epoch} rank {ctx.world_rank}/{ctx.world_size}: train_loss={train_loss:.4f} val_loss={val_loss:.4f} param_sum={param_sum(model):.10f}",
                flush=True,
            )
            saved = None
            if ctx.world_rank == 0:
                inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
                torch.save({"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, os.path.join(scratch, "state.pt"))
                saved = scratch
            if epoch == start_epoch + 1:
                print(f"rank {ctx.world_rank}: first report at {time.time():.6f}", flush=True)
            nestor.report({"val_loss": val_loss, "train_loss": train_loss, "epoch": epoch}, checkpoint=saved)


if __name__ == "__main__":
    main()
