"""Ray's ``ray.train.tensorflow.keras.ReportCheckpointCallback`` for nestor:
a Keras callback that reports ``fit``'s logs (and the model, as
``model.keras``, from rank 0) at the events it is told, and ends ``fit``
on every rank when the trial is stopped. Built when first asked for, on
``tf.keras.callbacks.Callback`` (Keras 2 under ``TensorflowTrainer``)."""

import shutil
import types
from typing import Any, Dict, List, Optional, Union

__all__ = ["ReportCheckpointCallback"]

_EVENTS = ("epoch_begin", "epoch_end", "train_batch_begin", "train_batch_end", "test_batch_begin", "test_batch_end",
           "predict_batch_begin", "predict_batch_end", "train_begin", "train_end", "test_begin", "test_end",
           "predict_begin", "predict_end")

_CLASSES: Dict[Any, Any] = {}


def _events(name: str, value: Union[str, List[str]]) -> List[str]:
    events = [value] if isinstance(value, str) else list(value)
    wrong = [e for e in events if e not in _EVENTS]
    if wrong:
        raise ValueError(f"ReportCheckpointCallback({name}={value!r}): {', '.join(map(repr, wrong))} is not a Keras event; "
                         f"give one of {', '.join(_EVENTS)}")
    return events


def _hook(event: str) -> Any:
    indexed = event.startswith("epoch") or "batch" in event  # (epoch or batch, logs) rather than (logs)

    def hook(self: Any, *args: Any, **kwargs: Any) -> None:
        logs = kwargs.get("logs", args[1] if indexed and len(args) > 1 else args[0] if not indexed and args else None)
        self._on(event, logs)

    hook.__name__ = f"on_{event}"
    return hook


def _callback_class() -> Any:
    from . import TensorflowCheckpoint, _tensorflow

    base = _tensorflow().keras.callbacks.Callback
    if base in _CLASSES:
        return _CLASSES[base]

    class ReportCheckpointCallback(base):  # type: ignore[misc, valid-type]
        """Reports ``metrics`` (all of Keras's logs when None; a name, a
        list of names, or a dict of reported name to Keras's name) at each
        event of ``report_metrics_on``, and with a checkpoint of the model at
        each event of ``checkpoint_on`` (metrics go with every checkpoint).
        A report of a stopped trial sets ``model.stop_training`` on every rank."""

        def __init__(self, checkpoint_on: Union[str, List[str]] = "epoch_end", report_metrics_on: Union[str, List[str]] = "epoch_end",
                     metrics: Optional[Union[str, List[str], Dict[str, str]]] = None):
            super().__init__()
            self._checkpoint_on = _events("checkpoint_on", checkpoint_on)
            self._report_on = _events("report_metrics_on", report_metrics_on)
            if metrics is not None and not isinstance(metrics, (str, list, dict)):
                raise ValueError(f"ReportCheckpointCallback(metrics=...) is {type(metrics).__name__}: give a name, a list or a dict")
            self._metrics = metrics
            # Keras's on_<event> methods for the events asked for alone: Keras
            # skips the per-batch calls (and their syncs) no callback overrides.
            for event in set(self._checkpoint_on + self._report_on):
                setattr(self, f"on_{event}", types.MethodType(_hook(event), self))

        def _reported(self, logs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
            logs = logs or {}
            if self._metrics is None:
                chosen = dict(logs)
            elif isinstance(self._metrics, str):
                chosen = {self._metrics: logs[self._metrics]}
            elif isinstance(self._metrics, list):
                chosen = {m: logs[m] for m in self._metrics}
            else:
                chosen = {name: logs[key] for name, key in self._metrics.items()}
            out = {}
            for k, v in chosen.items():
                try:
                    out[k] = float(v)
                except (TypeError, ValueError):
                    out[k] = v
            return out

        def _handle(self, logs: Optional[Dict[str, Any]], when: str) -> None:
            from .. import get_context
            from ... import _report_or_stop

            metrics = self._reported(logs)
            if when in self._checkpoint_on:
                # Every rank saves (reading a strategy's variables is a collective); the
                # ranks hold the same weights, and rank 0's copy is the checkpoint.
                checkpoint = TensorflowCheckpoint.from_model(self.model)
                try:
                    going = _report_or_stop(metrics, checkpoint if get_context().get_world_rank() == 0 else None)
                finally:
                    shutil.rmtree(checkpoint.path, ignore_errors=True)
            else:
                going = _report_or_stop(metrics)
            if not going:
                self.model.stop_training = True

        def _on(self, when: str, logs: Optional[Dict[str, Any]]) -> None:
            if when in self._checkpoint_on or when in self._report_on:
                self._handle(logs, when)

    ReportCheckpointCallback.__module__ = __name__
    _CLASSES[base] = ReportCheckpointCallback
    return ReportCheckpointCallback


def __getattr__(name: str) -> Any:
    if name == "ReportCheckpointCallback":
        return _callback_class()
    raise AttributeError(f"module 'nestor.train.tensorflow.keras' has no attribute {name!r}")
