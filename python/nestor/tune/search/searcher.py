"""Ray's module path ``ray.tune.search.searcher``."""

from . import Searcher

__all__ = ["Searcher"]
