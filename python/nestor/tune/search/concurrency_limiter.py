"""Ray's module path ``ray.tune.search.concurrency_limiter``."""

from . import ConcurrencyLimiter

__all__ = ["ConcurrencyLimiter"]
