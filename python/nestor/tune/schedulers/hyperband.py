"""Ray's module path `ray.tune.schedulers.hyperband`."""

from . import HyperBandScheduler

__all__ = ["HyperBandScheduler"]
