"""Ray's module path ``ray.tune.result_grid``."""

from .._results import ResultGrid

__all__ = ["ResultGrid"]
