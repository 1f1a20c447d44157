"""Ray's module path `ray.tune.schedulers.hb_bohb`."""

from . import HyperBandForBOHB

__all__ = ["HyperBandForBOHB"]
