"""Ray's module path `ray.tune.schedulers.pb2`."""

from . import PB2

__all__ = ["PB2"]
