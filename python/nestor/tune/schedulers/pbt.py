"""Ray's module path `ray.tune.schedulers.pbt`."""

from . import PopulationBasedTraining

__all__ = ["PopulationBasedTraining"]
