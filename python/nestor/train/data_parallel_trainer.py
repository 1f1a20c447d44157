"""Ray Train's ``DataParallelTrainer``: a training function on every rank of
a run, with a framework's ``BackendConfig`` setting the ranks up around it
(``nestor.train.backend``). ``TorchTrainer`` and the other trainers are
this with their framework's config."""

from typing import Any, Callable, Dict, Optional

from ._trainer import _Trainer
from .backend import BackendConfig

__all__ = ["DataParallelTrainer"]


class DataParallelTrainer(_Trainer):
    """``train_loop_per_worker(config)`` on ``scaling_config.num_workers``
    ranks, between the hooks of ``backend_config.backend_cls`` (which run
    in every rank: see ``nestor.train.backend``)."""

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, backend_config: Optional[BackendConfig] = None,
                 train_loop_config: Optional[Dict[str, Any]] = None, scaling_config: Any = None, run_config: Any = None,
                 datasets: Optional[Dict[str, Any]] = None, **kwargs: Any):
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets, **kwargs)
        if backend_config is not None and not isinstance(backend_config, BackendConfig):
            raise TypeError(f"backend_config is {type(backend_config).__name__}: give a nestor.train.backend.BackendConfig")
        self.backend_config = backend_config or BackendConfig()

    def _parts(self) -> Any:
        parts = super()._parts()
        parts["blob"]["backend_config"] = self.backend_config
        return parts
