"""Ray's module path `ray.tune.schedulers.trial_scheduler`."""

from . import FIFOScheduler, TrialScheduler

__all__ = ["FIFOScheduler", "TrialScheduler"]
