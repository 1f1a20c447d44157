"""Ray Tune's ``ray.tune.integration.pytorch_lightning``: a Lightning
``Trainer`` inside a function trainable (one process a trial, no
``TorchTrainer``) reports to Tune from a callback.

    trainer = pl.Trainer(max_epochs=10, callbacks=[
        TuneReportCheckpointCallback({"loss": "val_loss"}, on="validation_end")])

When the scheduler stops the trial, the callback sets ``trainer.should_stop``
and ``fit()`` ends at the next step; a later report ends the trial cleanly.
"""

import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Union

from ...train import _framework

pl = _framework.lightning()

__all__ = ["TuneReportCallback", "TuneReportCheckpointCallback"]

#: The hooks ``on=`` may name (Lightning's ``Callback.on_<hook>``).
_HOOKS = (
    "fit_start", "fit_end", "sanity_check_start", "sanity_check_end", "train_epoch_start", "train_epoch_end",
    "validation_epoch_start", "validation_epoch_end", "test_epoch_start", "test_epoch_end", "train_batch_start",
    "train_batch_end", "validation_batch_start", "validation_batch_end", "test_batch_start", "test_batch_end",
    "train_start", "train_end", "validation_start", "validation_end", "test_start", "test_end",
)


class TuneReportCheckpointCallback(pl.callbacks.Callback):
    """Reports ``metrics`` (a list of ``callback_metrics`` names, a dict of
    reported name -> Lightning name, or None for all of them) at each hook
    of ``on`` (default ``"validation_end"``), with a checkpoint the
    ``Trainer`` saves as ``filename`` when ``save_checkpoints``."""

    def __init__(self, metrics: Optional[Union[str, List[str], Dict[str, str]]] = None, filename: str = "checkpoint",
                 save_checkpoints: bool = True, on: Union[str, List[str]] = "validation_end") -> None:
        super().__init__()
        hooks = [on] if isinstance(on, str) else list(on)
        unknown = [h for h in hooks if h not in _HOOKS]
        if unknown:
            raise ValueError(f"{type(self).__name__}(on={unknown[0]!r}): give one of {', '.join(_HOOKS)}")
        self._on = set(hooks)
        self._metrics = [metrics] if isinstance(metrics, str) else metrics
        self._filename = filename
        self._save_checkpoints = save_checkpoints
        self.stopped = False

    def _report_dict(self, trainer: Any) -> Dict[str, Any]:
        found = trainer.callback_metrics
        if not self._metrics:
            return {k: (v.item() if hasattr(v, "item") else v) for k, v in found.items()}
        pairs = self._metrics.items() if isinstance(self._metrics, dict) else ((m, m) for m in self._metrics)
        out: Dict[str, Any] = {}
        for name, source in pairs:
            if source in found:
                value = found[source]
                out[name] = value.item() if hasattr(value, "item") else value
            else:
                print(f"nestor: {type(self).__name__}: Lightning logged no {source!r} (it has {', '.join(found) or 'nothing'})",
                      file=sys.stderr)
        return out

    def _handle(self, trainer: Any) -> None:
        if self.stopped or trainer.sanity_checking:
            return
        report = self._report_dict(trainer)
        if not report:
            return
        import nestor

        if not self._save_checkpoints:
            go_on = nestor._report_or_stop(report)
        else:
            with tempfile.TemporaryDirectory(prefix="nestor-lightning-") as d:
                trainer.save_checkpoint(os.path.join(d, self._filename))
                go_on = nestor._report_or_stop(report, d)
        if not go_on:
            self.stopped = True
            trainer.should_stop = True


def _hook(name: str) -> Any:
    def on_hook(self: TuneReportCheckpointCallback, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        if name in self._on:
            self._handle(trainer)

    on_hook.__name__ = f"on_{name}"
    return on_hook


for _name in _HOOKS:
    setattr(TuneReportCheckpointCallback, f"on_{_name}", _hook(_name))


class TuneReportCallback(TuneReportCheckpointCallback):
    """``TuneReportCheckpointCallback`` without checkpoints (Ray's older name)."""

    def __init__(self, metrics: Optional[Union[str, List[str], Dict[str, str]]] = None,
                 on: Union[str, List[str]] = "validation_end") -> None:
        super().__init__(metrics=metrics, save_checkpoints=False, on=on)
