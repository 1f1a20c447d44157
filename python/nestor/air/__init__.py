"""Ray 2.0-2.6's ``ray.air`` names, for scripts written against them."""

from ..train import Checkpoint, CheckpointConfig, FailureConfig, Result, RunConfig, ScalingConfig
from . import session

__all__ = ["Checkpoint", "CheckpointConfig", "FailureConfig", "Result", "RunConfig", "ScalingConfig", "session"]
