"""Ray's module path ``ray.tune.experiment.trial``."""

from ..callback import Trial

__all__ = ["Trial"]
