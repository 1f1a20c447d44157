"""Ray's module path `ray.tune.schedulers.async_hyperband`."""

from . import AsyncHyperBandScheduler, ASHAScheduler

__all__ = ["AsyncHyperBandScheduler", "ASHAScheduler"]
