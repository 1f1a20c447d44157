"""Ray's module path ``ray.tune.tune_config``."""

from . import TuneConfig

__all__ = ["TuneConfig"]
