"""Ray's module path ``ray.tune.tuner``."""

from . import Tuner

__all__ = ["Tuner"]
