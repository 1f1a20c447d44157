"""Ray 2.0-2.6's ``ray.air.session``: ``report``, ``get_checkpoint`` and the context's getters."""

from ..train import get_checkpoint, get_context, report


def get_world_rank() -> int:
    return get_context().get_world_rank()


def get_local_rank() -> int:
    return get_context().get_local_rank()


def get_world_size() -> int:
    return get_context().get_world_size()


def get_trial_id() -> str:
    return get_context().get_trial_id()


def get_trial_name() -> str:
    return get_context().get_trial_name()


def get_experiment_name() -> str:
    return get_context().get_experiment_name()


__all__ = ["get_checkpoint", "get_context", "report", "get_world_rank", "get_local_rank", "get_world_size", "get_trial_id",
           "get_trial_name", "get_experiment_name"]
