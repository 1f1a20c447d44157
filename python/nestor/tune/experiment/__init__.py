"""Ray's module path ``ray.tune.experiment``."""

from ..callback import Trial

__all__ = ["Trial"]
