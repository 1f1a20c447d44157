"""Ray's ``ray.actor`` names a training script imports for its type hints
(``ActorHandle`` in a custom ``DataConfig.configure``'s signature): nestor
has no actors; using one says so."""

from ._ray_api import Refused

#: Ray's handle to an actor: importable for type hints; nestor has no actors.
ActorHandle = Refused("ray.actor.ActorHandle", "nestor has no actors: a rank is a process of the trial's run")

__all__ = ["ActorHandle"]
