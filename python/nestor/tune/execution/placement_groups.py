"""Ray's ``ray.tune.execution.placement_groups`` path."""

from ..._resources import PlacementGroupFactory

__all__ = ["PlacementGroupFactory"]
