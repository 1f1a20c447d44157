"""Ray Train's ``ray.train.torch`` for nestor: ``TorchTrainer``, and the
helpers a training function calls on each worker (``prepare_model``,
``prepare_data_loader``, ``get_device``, ``get_devices``), which live in
``nestor.torch`` and are imported from there on first use, so the driver
process never imports torch."""

from typing import Any, Optional

from ._trainer import _Trainer


class TorchConfig:
    """The collective's backend (``gloo``/``nccl``) and timeout."""

    def __init__(self, backend: Optional[str] = None, init_method: str = "env", timeout_s: int = 1800):
        self.backend, self.init_method, self.timeout_s = backend, init_method, timeout_s


class TorchTrainer(_Trainer):
    """``train_loop_per_worker(config)`` on ``scaling_config.num_workers``
    workers, in one torch process group once ``prepare_model`` (or
    ``nestor.torch.init_process_group``) is called."""

    def __init__(self, train_loop_per_worker: Any, *, train_loop_config: Any = None, torch_config: Optional[TorchConfig] = None,
                 scaling_config: Any = None, run_config: Any = None, datasets: Any = None, **kwargs: Any):
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets, **kwargs)
        self.torch_config = torch_config or TorchConfig()

    def _parts(self) -> Any:
        parts = super()._parts()
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
