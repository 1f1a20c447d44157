"""Ray Tune's ``ray.tune.integration.xgboost`` for nestor:
``TuneReportCheckpointCallback``, the XGBoost callback a function trainable
passes to ``xgboost.train`` (or ``xgboost.cv``, with
``results_postprocessing_fn`` to fold the folds' results): the round's eval
metrics every round, the booster as a checkpoint every ``frequency`` rounds
and at the end. It is ``nestor.train.xgboost.RayTrainReportCallback`` under
Tune's name (xgboost is imported when it is first asked for)."""

from typing import Any

__all__ = ["TuneReportCheckpointCallback", "TuneReportCallback"]


class TuneReportCallback:
    """Removed from Ray: use ``TuneReportCheckpointCallback``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise DeprecationWarning("`TuneReportCallback` is deprecated (as in Ray): use "
                                 "`nestor.tune.integration.xgboost.TuneReportCheckpointCallback` instead")


def __getattr__(name: str) -> Any:
    if name == "TuneReportCheckpointCallback":
        from ...train.xgboost import _callback_class

        return _callback_class()
    raise AttributeError(f"module 'nestor.tune.integration.xgboost' has no attribute {name!r}")
