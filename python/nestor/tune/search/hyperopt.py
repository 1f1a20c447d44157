"""Ray's ``ray.tune.search.hyperopt`` path."""

from . import HyperOptSearch

__all__ = ["HyperOptSearch"]
