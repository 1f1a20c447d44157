"""Ray's module path ``ray.tune.search.repeater``."""

from . import Repeater

__all__ = ["Repeater"]
