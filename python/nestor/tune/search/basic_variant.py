"""Ray's ``ray.tune.search.basic_variant`` path."""

from . import BasicVariantGenerator

__all__ = ["BasicVariantGenerator"]
