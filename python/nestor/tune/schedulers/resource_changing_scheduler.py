"""Ray's module path `ray.tune.schedulers.resource_changing_scheduler`."""

from . import DistributeResources, DistributeResourcesToTopJob, ResourceChangingScheduler

__all__ = ["DistributeResources", "DistributeResourcesToTopJob", "ResourceChangingScheduler"]
