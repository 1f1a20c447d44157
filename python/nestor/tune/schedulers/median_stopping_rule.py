"""Ray's module path `ray.tune.schedulers.median_stopping_rule`."""

from . import MedianStoppingRule

__all__ = ["MedianStoppingRule"]
