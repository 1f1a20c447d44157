"""Ray Tune's class API (``ray.tune.Trainable``): see ``nestor._trainable``,
where it lives so that the worker runs it without importing this package."""

from .._trainable import Trainable

__all__ = ["Trainable"]
