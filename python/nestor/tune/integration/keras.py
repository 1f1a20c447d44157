"""Ray Tune's ``ray.tune.integration.keras`` for nestor:
``TuneReportCheckpointCallback``, the Keras callback a function trainable
passes to ``model.fit``. It is ``nestor.train.tensorflow.keras.ReportCheckpointCallback``
under Tune's name, built on the ``tf.keras`` of the process (Keras 3 unless
``TF_USE_LEGACY_KERAS=1``); TensorFlow is imported when it is first asked for."""

from typing import Any

__all__ = ["TuneReportCheckpointCallback", "TuneReportCallback"]

_DEPRECATED = ("`{}` is deprecated (as in Ray): use `nestor.tune.integration.keras.TuneReportCheckpointCallback` "
               "or `nestor.train.tensorflow.keras.ReportCheckpointCallback`")


class TuneReportCallback:
    """Removed from Ray: use ``TuneReportCheckpointCallback``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise DeprecationWarning(_DEPRECATED.format(cls.__name__))


class _TuneCheckpointCallback(TuneReportCallback):
    """Removed from Ray: use ``TuneReportCheckpointCallback``."""


def __getattr__(name: str) -> Any:
    if name == "TuneReportCheckpointCallback":
        from ...train.tensorflow.keras import _callback_class

        return _callback_class()
    raise AttributeError(f"module 'nestor.tune.integration.keras' has no attribute {name!r}")
