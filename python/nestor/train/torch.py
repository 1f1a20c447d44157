"""Ray Train's ``ray.train.torch`` for nestor: ``TorchTrainer``, and the
helpers a training function calls on each worker (``prepare_model``,
``prepare_data_loader``, ``get_device``, ``get_devices``), which live in
``nestor.torch`` and are imported from there on first use, so the driver
process never imports torch."""

import sys
from typing import Any, Optional

from ._trainer import _Trainer


class TorchConfig:
    """The collective's backend (``gloo``/``nccl``) and timeout."""

    def __init__(self, backend: Optional[str] = None, init_method: str = "env", timeout_s: int = 1800):
        if backend not in (None, "gloo", "nccl", "mpi", "ucc"):
            raise ValueError(f"TorchConfig(backend={backend!r}): give 'gloo', 'nccl' (or None: nccl on GPUs, gloo on CPUs)")
        if init_method not in ("env", "tcp"):
            raise ValueError(f"TorchConfig(init_method={init_method!r}): Ray takes 'env' or 'tcp'")
        if init_method != "env":
            print(f"nestor: TorchConfig(init_method={init_method!r}) is ignored: nestor chooses how the ranks meet "
                  "(a file on one machine, the driver across nodes)", file=sys.stderr)
        self.backend, self.init_method, self.timeout_s = backend, init_method, timeout_s


class TorchTrainer(_Trainer):
    """``train_loop_per_worker(config)`` on ``scaling_config.num_workers``
    workers, in one torch process group (``TorchConfig``'s backend and
    timeout) that is up before the function runs and torn down after it."""

    def __init__(self, train_loop_per_worker: Any, *, train_loop_config: Any = None, torch_config: Optional[TorchConfig] = None,
                 scaling_config: Any = None, run_config: Any = None, datasets: Any = None, **kwargs: Any):
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets, **kwargs)
        self.torch_config = torch_config or TorchConfig()

    def _parts(self) -> Any:
        parts = super()._parts()
        parts["blob"]["backend"] = "torch"
        parts["trainer_extra"] = {}
        if self.torch_config.backend:
            parts["trainer_extra"]["backend"] = self.torch_config.backend
        if self.torch_config.timeout_s != 1800:
            parts["trainer_extra"]["collective_timeout_s"] = float(self.torch_config.timeout_s)
        return parts


_HELPERS = ("prepare_model", "prepare_data_loader", "get_device", "get_devices", "enable_reproducibility", "init_process_group")


def __getattr__(name: str) -> Any:
    if name in _HELPERS:
        from .. import torch as helpers

        return getattr(helpers, name)
    raise AttributeError(f"module 'nestor.train.torch' has no attribute {name!r}")


__all__ = ["TorchConfig", "TorchTrainer", *_HELPERS]
