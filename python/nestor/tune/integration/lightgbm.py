"""Ray Tune's ``ray.tune.integration.lightgbm`` for nestor:
``TuneReportCheckpointCallback``, the LightGBM callback a function trainable
passes to ``lightgbm.train``: the round's eval metrics every round, the
booster (``model.txt``) as a checkpoint every ``frequency`` rounds and at
the end. It is ``nestor.train.lightgbm.RayTrainReportCallback`` under
Tune's name."""

from typing import Any

from ...train.lightgbm import RayTrainReportCallback as TuneReportCheckpointCallback

__all__ = ["TuneReportCheckpointCallback", "TuneReportCallback"]


class TuneReportCallback:
    """Removed from Ray: use ``TuneReportCheckpointCallback``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise DeprecationWarning("`TuneReportCallback` is deprecated (as in Ray): use "
                                 "`nestor.tune.integration.lightgbm.TuneReportCheckpointCallback` instead")
