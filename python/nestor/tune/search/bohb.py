"""Ray's ``ray.tune.search.bohb`` path."""

from . import TuneBOHB

__all__ = ["TuneBOHB"]
