"""Ray Train's ``ray.train.huggingface.transformers`` for nestor: a Hugging
Face ``transformers.Trainer`` run inside a ``TorchTrainer``'s training
function reports each checkpoint it saves, and stops when the scheduler says.

    trainer = transformers.Trainer(model=..., args=args, train_dataset=..., eval_dataset=...)
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    trainer.train()

The process group is up before the training function runs (nestor sets the
variables torchrun sets), so the ``Trainer`` trains data-parallel across the
trial's workers as it does under torchrun. ``prepare_trainer`` feeds it the
rank's share of the trainer's ``datasets=`` when that is what it was given.
"""

import os
import shutil
from typing import Any, Dict

from .. import _framework

transformers = _framework.need("transformers", "huggingface")

__all__ = ["RayTrainReportCallback", "prepare_trainer"]


class RayTrainReportCallback(transformers.TrainerCallback):
    """At each save of the ``Trainer``: one report, with the metrics logged
    so far (the latest value of each: ``loss``, ``eval_loss``, ``epoch``,
    ...) and the checkpoint just saved, under ``checkpoint/`` in the
    reported directory (as in Ray). Align ``eval_strategy`` with
    ``save_strategy`` so each report carries its evaluation.

    When the scheduler stops the trial, the ``Trainer`` ends at that step
    (``control.should_training_stop``) on every rank, and any later report
    ends the worker cleanly."""

    CHECKPOINT_NAME = "checkpoint"

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.stopped:
            return control
        import nestor

        metrics: Dict[str, Any] = {}
        for entry in state.log_history:
            metrics.update(entry)
        metrics.setdefault("step", state.global_step)
        # Every rank has written its part of the checkpoint before one is copied.
        _framework.barrier()
        saved = os.path.join(args.output_dir, f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        ctx = nestor.get_context()
        staging = None
        if os.path.isdir(saved) and _framework.rank_reports_files(ctx, saved):
            staging = _framework.staging_dir(saved)
            _framework.link_tree(saved, os.path.join(staging, self.CHECKPOINT_NAME))
        try:
            if not nestor._report_or_stop(metrics, staging):
                self.stopped = True
                control.should_training_stop = True
        finally:
            if staging:
                shutil.rmtree(staging, ignore_errors=True)
        return control


def _iterable(batches: Any) -> Any:
    """A torch ``IterableDataset`` over an iterable of ready batches (a
    rank's ``iter_torch_batches()``): each pass, the next epoch."""
    import torch

    class _Shard(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter(batches)

    return _Shard()


def _is_shard(dataset: Any) -> bool:
    """Whether ``dataset`` is this rank's data set shard, or its batches."""
    from ...data import DataIterator
    from ...data._iterator import _Epochs

    return isinstance(dataset, (DataIterator, _Epochs))


def prepare_trainer(trainer: Any) -> Any:
    """Readies ``trainer`` for a run across the trial's workers, as Ray's
    does: a ``train_dataset`` or ``eval_dataset`` that is this rank's data
    set shard (``get_dataset_shard("train").iter_torch_batches(...)``, or
    the shard itself) is fed to it batch by batch, each rank its own share
    and each epoch the next (the ``Trainer`` then needs ``max_steps``, as
    under Ray); a torch data set is left to the ``Trainer``'s own
    distributed sampler."""
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(f"prepare_trainer takes a transformers.Trainer, not {type(trainer).__name__}")
    if not any(isinstance(c, RayTrainReportCallback) for c in trainer.callback_handler.callbacks):
        import sys

        print("nestor: prepare_trainer: this Trainer has no RayTrainReportCallback, so it reports nothing to nestor "
              "(trainer.add_callback(RayTrainReportCallback()))", file=sys.stderr)
    base = type(trainer)
    if getattr(base, "_nestor_prepared", False):
        return trainer

    class PreparedTrainer(base):  # type: ignore[misc, valid-type]
        _nestor_prepared = True

        def _shard_loader(self, dataset: Any) -> Any:
            import torch
            from torch.utils.data import DataLoader

            if not _is_shard(dataset):
                return None
            from ...data import DataIterator

            batches = dataset
            if isinstance(batches, DataIterator):
                batches = batches.iter_torch_batches(batch_size=self.args.per_device_train_batch_size)
            device = self.args.device
            moved = _Moved(batches, device if isinstance(device, torch.device) else None)
            # The batches are whole already: the loader hands each on as it is.
            return DataLoader(_iterable(moved), batch_size=None)

        def get_train_dataloader(self) -> Any:
            loader = self._shard_loader(self.train_dataset)
            return loader if loader is not None else super().get_train_dataloader()

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
            loader = None if isinstance(dataset, dict) else self._shard_loader(dataset)
            return loader if loader is not None else super().get_eval_dataloader(eval_dataset)

    PreparedTrainer.__name__ = base.__name__
    PreparedTrainer.__qualname__ = base.__qualname__
    trainer.__class__ = PreparedTrainer
    return trainer


class _Moved:
    """Batches on the ``Trainer``'s device (it moves them itself too; this only spares a copy)."""

    def __init__(self, batches: Any, device: Any):
        self.batches, self.device = batches, device

    def __iter__(self) -> Any:
        for batch in self.batches:
            if self.device is not None and isinstance(batch, dict):
                batch = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in batch.items()}
            yield batch
