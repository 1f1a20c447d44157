"""Ray's ``ray.tune.search.optuna`` path."""

from . import OptunaSearch

__all__ = ["OptunaSearch"]
