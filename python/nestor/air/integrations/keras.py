"""Ray's ``ray.air.integrations.keras``: ``ReportCheckpointCallback``, the
Keras callback of ``nestor.train.tensorflow.keras`` under its older path
(TensorFlow is imported when it is first asked for)."""

from typing import Any

__all__ = ["ReportCheckpointCallback"]


def __getattr__(name: str) -> Any:
    if name == "ReportCheckpointCallback":
        from ...train.tensorflow.keras import _callback_class

        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
