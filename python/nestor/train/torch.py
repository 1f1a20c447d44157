"""Ray Train's ``ray.train.torch`` for nestor: ``TorchTrainer``, and the
helpers a training function calls on each worker (``prepare_model``,
``prepare_data_loader``, ``get_device``, ``get_devices``), which live in
``nestor.torch`` and are imported from there on first use, so the driver
process never imports torch."""

import sys
from typing import Any, Optional

from .backend import Backend, BackendConfig
from .data_parallel_trainer import DataParallelTrainer


class TorchConfig(BackendConfig):
    """The collective's backend (``gloo``/``nccl``) and timeout; its
    ``Backend`` joins every rank to one torch process group before the
    training function runs and leaves it after."""

    def __init__(self, backend: Optional[str] = None, init_method: str = "env", timeout_s: int = 1800):
        if backend not in (None, "gloo", "nccl", "mpi", "ucc"):
            raise ValueError(f"TorchConfig(backend={backend!r}): give 'gloo', 'nccl' (or None: nccl on GPUs, gloo on CPUs)")
        if init_method not in ("env", "tcp"):
            raise ValueError(f"TorchConfig(init_method={init_method!r}): Ray takes 'env' or 'tcp'")
        if init_method != "env":
            print(f"nestor: TorchConfig(init_method={init_method!r}) is ignored: nestor chooses how the ranks meet "
                  "(a file on one machine, the driver across nodes)", file=sys.stderr)
        self.backend, self.init_method, self.timeout_s = backend, init_method, timeout_s

    @property
    def backend_cls(self) -> Any:
        return _TorchBackend


class _TorchBackend(Backend):
    def on_start(self, worker_group: Any, backend_config: TorchConfig) -> None:
        # The backend and timeout reach the ranks as NESTOR_TORCH_BACKEND and NESTOR_COLLECTIVE_TIMEOUT_S.
        try:
            from .. import torch as nestor_torch
        except ImportError as e:
            print(f"nestor: no torch process group: {e}", file=sys.stderr, flush=True)
            return
        nestor_torch.init_process_group(always=True, _group=worker_group)

    def on_shutdown(self, worker_group: Any, backend_config: TorchConfig) -> None:
        from .._worker import _shutdown_torch

        _shutdown_torch()


class TorchTrainer(DataParallelTrainer):
    """``train_loop_per_worker(config)`` on ``scaling_config.num_workers``
    workers, in one torch process group (``TorchConfig``'s backend and
    timeout) that is up before the function runs and torn down after it:
    a ``DataParallelTrainer`` with ``TorchConfig``'s backend."""

    def __init__(self, train_loop_per_worker: Any, *, train_loop_config: Any = None, torch_config: Optional[TorchConfig] = None,
                 scaling_config: Any = None, run_config: Any = None, datasets: Any = None, **kwargs: Any):
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise TypeError(f"torch_config is {type(torch_config).__name__}: give a nestor.train.torch.TorchConfig")
        self.torch_config = torch_config or TorchConfig()
        super().__init__(train_loop_per_worker, backend_config=self.torch_config, train_loop_config=train_loop_config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets, **kwargs)

    def _parts(self) -> Any:
        parts = super()._parts()
        parts["blob"]["backend"] = "torch"  # the warm process loads torch once for its ranks
        parts["trainer_extra"] = {}
        if self.torch_config.backend:
            parts["trainer_extra"]["backend"] = self.torch_config.backend
        if self.torch_config.timeout_s != 1800:
            parts["trainer_extra"]["collective_timeout_s"] = float(self.torch_config.timeout_s)
        return parts


_HELPERS = ("prepare_model", "prepare_data_loader", "get_device", "get_devices", "enable_reproducibility", "init_process_group",
            "accelerate", "backward", "prepare_optimizer")


def __getattr__(name: str) -> Any:
    if name in _HELPERS:
        from .. import torch as helpers

        return getattr(helpers, name)
    raise AttributeError(f"module 'nestor.train.torch' has no attribute {name!r}")


__all__ = ["TorchConfig", "TorchTrainer", *_HELPERS]
