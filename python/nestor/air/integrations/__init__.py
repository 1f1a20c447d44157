"""Ray's experiment-tracking integrations (``ray.air.integrations``)."""

from typing import Any


class _Noop:
    """What ``setup_mlflow`` and ``setup_wandb`` give the ranks that do not log: every call does nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None
