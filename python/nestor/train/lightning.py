"""Ray Train's ``ray.train.lightning`` for nestor: a Lightning ``Trainer``
run inside a ``TorchTrainer``'s training function, across the trial's
workers, reporting a checkpoint at each epoch's end and stopping when the
scheduler says.

    trainer = pl.Trainer(
        devices="auto", accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        enable_checkpointing=False,
    )
    trainer = prepare_trainer(trainer)
    trainer.fit(model, train_loader, val_loader)

The process group is up before the training function runs; the strategies
join it (Lightning sees it initialised) and shard each ``DataLoader`` by the
trial's world size and rank. The classes are built on the Lightning package
the training code imported (``pytorch_lightning`` or ``lightning.pytorch``),
else on ``lightning.pytorch`` where installed.
"""

import os
import shutil
from typing import Any, Dict

from . import _framework

pl = _framework.lightning()
_environments = _framework.need(f"{pl.__name__}.plugins.environments", "lightning")

__all__ = ["RayDDPStrategy", "RayDeepSpeedStrategy", "RayFSDPStrategy", "RayLightningEnvironment", "RayTrainReportCallback",
           "prepare_trainer"]


def _ctx() -> Any:
    import nestor

    return nestor.get_context()


def _device() -> Any:
    from .. import torch as nestor_torch

    return nestor_torch.get_device()


class _TrialWorkers:
    """What the three strategies share: this worker's device, and each
    ``DataLoader`` sharded by the trial's world size and rank."""

    @property
    def root_device(self) -> Any:
        return _device()

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        ctx = _ctx()
        return {"num_replicas": ctx.world_size, "rank": ctx.world_rank}


class RayDDPStrategy(_TrialWorkers, pl.strategies.DDPStrategy):
    """Lightning's ``DDPStrategy`` over the trial's workers."""


class RayFSDPStrategy(_TrialWorkers, pl.strategies.FSDPStrategy):
    """Lightning's ``FSDPStrategy`` over the trial's workers (FSDP as
    Lightning builds it needs GPUs; ``nestor.train.torch.prepare_model(...,
    parallel_strategy="fsdp")`` shards on CPUs too)."""


class RayDeepSpeedStrategy(_TrialWorkers, pl.strategies.DeepSpeedStrategy):
    """Lightning's ``DeepSpeedStrategy`` over the trial's workers (needs the
    ``deepspeed`` package and, in practice, GPUs)."""


class RayLightningEnvironment(_environments.LightningEnvironment):
    """The trial's ranks and sizes as Lightning's cluster environment:
    nestor started the processes, so Lightning starts none and changes no rank."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return _ctx().world_size

    def global_rank(self) -> int:
        return _ctx().world_rank

    def local_rank(self) -> int:
        return _ctx().local_rank

    def node_rank(self) -> int:
        return _ctx().node_rank

    def set_world_size(self, size: int) -> None:
        pass

    def set_global_rank(self, rank: int) -> None:
        pass

    def teardown(self) -> None:
        pass


class RayTrainReportCallback(pl.callbacks.Callback):
    """At each training epoch's end: one report with the ``Trainer``'s
    ``callback_metrics`` (validation's included) plus ``epoch`` and ``step``,
    and the checkpoint ``trainer.save_checkpoint`` writes, as
    ``checkpoint.ckpt`` in the reported directory (as in Ray; a sharded
    strategy's checkpoint directory under the same name). When the
    scheduler stops the trial, ``trainer.fit()`` ends after this epoch on
    every rank, and any later report ends the worker cleanly."""

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.stopped:
            return
        import nestor

        metrics: Dict[str, Any] = {}
        for name, value in trainer.callback_metrics.items():
            metrics[name] = value.item() if hasattr(value, "item") else value
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        ctx = _ctx()
        # The ranks of a node save into the same directory (a sharded
        # strategy writes every rank's part beside the others).
        folder = os.path.join(ctx.trial_dir, ".lightning-checkpoints", f"epoch-{trainer.current_epoch}-node-{ctx.node_rank}")
        if ctx.local_rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
        trainer.strategy.barrier()
        trainer.save_checkpoint(os.path.join(folder, self.CHECKPOINT_NAME), weights_only=False)
        trainer.strategy.barrier()
        reports = _framework.rank_reports_files(ctx, folder)
        try:
            if not nestor._report_or_stop(metrics, folder if reports else None):
                self.stopped = True
                trainer.should_stop = True
        finally:
            # The report copied the files before it returned, for every rank.
            if ctx.local_rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
                try:
                    os.rmdir(os.path.dirname(folder))
                except OSError:
                    pass  # another node's folder is still there


_STRATEGIES = (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)


def prepare_trainer(trainer: Any) -> Any:
    """Checks that ``trainer`` runs across the trial's workers (one of the
    strategies above, ``RayLightningEnvironment``) and returns it."""
    import sys

    if not isinstance(trainer, pl.Trainer):
        raise TypeError(f"prepare_trainer takes a {pl.__name__}.Trainer, not {type(trainer).__module__}.{type(trainer).__name__} "
                        "(the Trainer and nestor.train.lightning must come from the same Lightning package)")
    strategy = trainer.strategy
    if not isinstance(strategy, _STRATEGIES):
        print(f"nestor: prepare_trainer: the strategy is {type(strategy).__name__}: give RayDDPStrategy, RayFSDPStrategy "
              "or RayDeepSpeedStrategy so the trial's workers train together", file=sys.stderr)
    env = getattr(strategy, "cluster_environment", None)
    if env is not None and not isinstance(env, RayLightningEnvironment):
        print(f"nestor: prepare_trainer: the cluster environment is {type(env).__name__}: give "
              "plugins=[RayLightningEnvironment()] so Lightning sees the trial's ranks", file=sys.stderr)
    return trainer
