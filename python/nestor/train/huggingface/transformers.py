"""Ray Train's ``ray.train.huggingface.transformers`` for nestor: a Hugging
Face ``transformers.Trainer`` run inside a ``TorchTrainer``'s training
function reports each checkpoint it saves, and stops when the scheduler says.

    trainer = transformers.Trainer(model=..., args=args, train_dataset=..., eval_dataset=...)
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    trainer.train()

The process group is up before the training function runs (nestor sets the
variables torchrun sets), so the ``Trainer`` trains data-parallel across the
trial's workers as it does under torchrun.
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


def prepare_trainer(trainer: Any) -> Any:
    """Checks ``trainer`` for a run across the trial's workers and returns
    it. Ray's version also feeds Ray Data datasets to it; nestor has none, so
    give the ``Trainer`` torch datasets (each rank gets its share through the
    ``Trainer``'s own distributed sampler)."""
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(f"prepare_trainer takes a transformers.Trainer, not {type(trainer).__name__}")
    if not any(isinstance(c, RayTrainReportCallback) for c in trainer.callback_handler.callbacks):
        import sys

        print("nestor: prepare_trainer: this Trainer has no RayTrainReportCallback, so it reports nothing to nestor "
              "(trainer.add_callback(RayTrainReportCallback()))", file=sys.stderr)
    return trainer
