"""A torch DataLoader with 4 worker processes (persistent, prefetching)
inside each rank of a 2-rank DDP run, after the rank's channel to the
driver is open (a report has been made): the most common PyTorch input
pipeline, in every way a rank can start.

Usage: dataloader_ranks.py STORAGE MODE [lightning]
       dataloader_ranks.py --worker   (a TOML sweep's command: the Lightning run in this rank)
  lightning: the loaders are a Lightning Trainer's (a DataModule's train and
        validation loaders, 4 workers each), as in Ray's Lightning examples
  MODE: warm        TorchTrainer from the Python driver, ranks forked from the warm process
        cold        the same, each rank a fresh interpreter (NESTOR_WARM=0)
        in-trial    TorchTrainer.fit() inside a Tune trial (Ray Train V2's Tune pattern)
        slurm-jobs  TorchTrainer, each run a Slurm job of its own (needs a test cluster)
        (in a Slurm allocation, "warm" runs its ranks as a Slurm step)
Prints ``RANKS {...}``: per rank, the samples it saw an epoch and the DataLoader worker pids.
"""

import json
import os
import sys
import tempfile

from nestor import train, tune
from nestor.train import RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer

EPOCHS = 3
SAMPLES = 512


class Images:
    """An image-shaped data set whose items say which worker process made them."""

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        import torch

        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 16, 16, generator=g), i % 10, os.getpid()


def train_loop(config):
    import torch
    from torch.utils.data import DataLoader

    import nestor.train.torch as nt

    ctx = train.get_context()
    # The channel to the driver was just opened (the ranks met through it,
    # gRPC's threads still busy) when the first workers fork, as a
    # Lightning Trainer's sanity check does.
    checked = sum(len(y) for _, y, _ in DataLoader(Images(), batch_size=64, num_workers=4))
    train.report({"epoch": 0.0, "seen": float(checked), "workers": 0.0})
    model = nt.prepare_model(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 10)))
    loader = DataLoader(Images(), batch_size=32, shuffle=True, num_workers=4, persistent_workers=True, prefetch_factor=3)
    loader = nt.prepare_data_loader(loader)
    assert loader.loader.persistent_workers and loader.loader.prefetch_factor == 3, "prepare_data_loader kept the loader's options"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(1, EPOCHS + 1):
        seen, pids = 0, set()
        for x, y, pid in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += len(y)
            pids.update(int(p) for p in pid)
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            train.report({"epoch": float(epoch), "seen": float(seen), "workers": float(len(pids)), "loss": float(loss.detach())},
                         checkpoint=train.Checkpoint.from_directory(d))
        # Right after the report: an evaluation loader whose 4 workers start anew each epoch,
        # forked while gRPC's threads may still be busy with the call just made.
        evaluated, eval_pids = 0, set()
        with torch.no_grad():
            for x, y, pid in DataLoader(Images(), batch_size=64, num_workers=4):
                evaluated += len(y)
                eval_pids.update(int(p) for p in pid)
        # Every rank writes what it saw; rank 0's metrics are the trial's.
        with open(os.path.join(config["out"], f"rank-{ctx.get_world_rank()}-epoch-{epoch}.json"), "w") as f:
            json.dump({"seen": seen, "pids": sorted(pids), "me": os.getpid(), "evaluated": evaluated, "eval_pids": sorted(eval_pids)}, f)


def lightning_loop(config):
    """The same run as a Lightning Trainer's: a DataModule's train loader
    (persistent workers) and validation loader (workers anew each epoch)."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    from nestor.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    ctx = train.get_context()
    seen = {}

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3 * 16 * 16, 10)

        def training_step(self, batch, i):
            x, y, pid = batch
            seen.setdefault(self.current_epoch + 1, [0, set()])[0] += len(y)
            seen[self.current_epoch + 1][1].update(int(p) for p in pid)
            loss = torch.nn.functional.cross_entropy(self.net(x.flatten(1)), y)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, i):
            x, y, _ = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x.flatten(1)), y), sync_dist=True)

        def on_train_epoch_end(self):
            n, pids = seen[self.current_epoch + 1]
            with open(os.path.join(config["out"], f"rank-{ctx.get_world_rank()}-epoch-{self.current_epoch + 1}.json"), "w") as f:
                json.dump({"seen": n, "pids": sorted(pids), "me": os.getpid()}, f)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(Images(), batch_size=32, shuffle=True, num_workers=4, persistent_workers=True)

        def val_dataloader(self):
            return DataLoader(Images(), batch_size=64, num_workers=4)

    t = pl.Trainer(max_epochs=EPOCHS, accelerator="cpu", strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
                   callbacks=[RayTrainReportCallback()], enable_progress_bar=False, enable_checkpointing=False, logger=False)
    prepare_trainer(t).fit(Model(), datamodule=Data())


def trainer(config, run_config=None):
    loop = lightning_loop if config.get("lightning") else train_loop
    return TorchTrainer(loop, train_loop_config=config,
                        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                        run_config=run_config)


def in_trial(config):
    from nestor.tune.integration.ray_train import TuneReportCallback

    trainer(config, RunConfig(callbacks=[TuneReportCallback()])).fit()


def worker():
    """A rank of a TOML sweep (``command = [python, dataloader_ranks.py, --worker]``)."""
    import nestor
    import nestor.torch

    nestor.torch.init_process_group()
    config = nestor.get_config()
    os.makedirs(config["out"], exist_ok=True)
    ctx = train.get_context()
    if ctx.get_world_rank() == 0:
        # A TOML sweep's ranks know their experiment as the Python driver's do.
        with open(os.path.join(os.path.dirname(config["out"]), "context.json"), "w") as f:
            json.dump({"experiment": ctx.get_experiment_name(), "storage": ctx.get_storage(),
                       "local_world_size": ctx.get_local_world_size(), "node_rank": ctx.get_node_rank()}, f)
    (lightning_loop if config.get("lightning") else train_loop)(config)


def main():
    if sys.argv[1:] == ["--worker"]:
        worker()
        return
    storage, mode = sys.argv[1], sys.argv[2]
    lightning = sys.argv[3:] == ["lightning"]
    if lightning:
        mode += "-lightning"
    out = os.path.join(storage, f"ranks-{mode}")
    os.makedirs(out, exist_ok=True)
    if mode.startswith("cold"):
        os.environ["NESTOR_WARM"] = "0"
    if mode.startswith("slurm-jobs"):
        import nestor

        nestor.init(cluster=nestor.SlurmJobs(poll_s=0.5, signal_s=0))
    config = {"out": out, "lightning": lightning}
    if mode.startswith("in-trial"):
        grid = tune.Tuner(in_trial, param_space=config,
                          run_config=tune.RunConfig(name=f"dl-{mode}", storage_path=storage)).fit()
        result = grid[0]
        if result.error:
            raise result.error
        metrics = result.metrics
    else:
        metrics = trainer(config, RunConfig(name=f"dl-{mode}", storage_path=storage)).fit().metrics
    ranks = {}
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as f:
            ranks[name[: -len(".json")]] = json.load(f)
    print("RANKS " + json.dumps({"metrics": {k: metrics.get(k) for k in ("epoch", "seen", "workers", "val_loss")}, "ranks": ranks}))


if __name__ == "__main__":
    main()
