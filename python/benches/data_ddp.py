"""A 2-worker DDP epoch fed by ``get_dataset_shard`` against the same epoch
fed by a ``DistributedSampler`` over an in-memory tensor
(``prepare_data_loader``), on the same rows and model.

    VENV=$(examples/torch_ddp/venv.sh)
    NESTOR_BIN=target/release/nestor "$VENV/bin/python" python/benches/data_ddp.py [--rows 200000] [--epochs 4]

Each side is one TorchTrainer run; each epoch's time is taken inside the
training function (rank 0), and the first epoch (warming up) is left out.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nestor import data, train
from nestor.train import RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer

BATCH = 256


def loop(config):
    import torch
    from torch import nn

    import nestor.train.torch

    torch.manual_seed(0)
    model = nestor.train.torch.prepare_model(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if config["side"] == "sampler":
        t = pq.read_table(config["path"])
        x = torch.as_tensor(np.stack([t.column(f"f{i}").to_numpy() for i in range(8)], axis=1))
        y = torch.as_tensor(t.column("y").to_numpy()).unsqueeze(1)
        loader = nestor.train.torch.prepare_data_loader(
            torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True))

        def batches():
            return iter(loader)
    else:
        shard = train.get_dataset_shard("train")

        def batches():
            for b in shard.iter_torch_batches(batch_size=BATCH):
                yield torch.stack([b[f"f{i}"] for i in range(8)], dim=1), b["y"].unsqueeze(1)

    for epoch in range(config["epochs"]):
        t0 = time.perf_counter()
        for xb, yb in batches():
            opt.zero_grad()
            nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
        train.report({"epoch_s": time.perf_counter() - t0})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--epochs", type=int, default=4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(0)
        cols = {f"f{i}": rng.standard_normal(a.rows, dtype=np.float32) for i in range(8)}
        cols["y"] = sum(cols.values()).astype(np.float32)
        path = os.path.join(d, "train.parquet")
        pq.write_table(pa.table(cols), path, row_group_size=65536)
        out = {}
        for side in ("shard", "sampler"):
            datasets = {"train": data.read_parquet(path).random_shuffle(seed=0)} if side == "shard" else None
            result = TorchTrainer(loop, train_loop_config={"side": side, "path": path, "epochs": a.epochs}, datasets=datasets,
                                  scaling_config=ScalingConfig(num_workers=2),
                                  run_config=RunConfig(name=side, storage_path=os.path.join(d, "runs"))).fit()
            times = [h["epoch_s"] for h in result.metrics_history][1:]
            out[side] = f"{statistics.median(times):.2f} s an epoch ({min(times):.2f}-{max(times):.2f})"
        print(json.dumps({"rows": a.rows, "batch": BATCH, **out}, indent=1))


if __name__ == "__main__":
    main()
