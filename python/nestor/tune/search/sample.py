"""Ray's module path ``ray.tune.search.sample``."""

from .._space import Domain, choice, grid_search, lograndint, loguniform, qlograndint, qloguniform, qrandint, qrandn, quniform, randint, randn, sample_from, uniform

__all__ = ["Domain", "choice", "grid_search", "lograndint", "loguniform", "qlograndint", "qloguniform", "qrandint", "qrandn", "quniform", "randint", "randn", "sample_from", "uniform"]
