"""The trainers' common part: a training function run on every worker of
one run, ``fit()`` as a sweep of one trial."""

from typing import Any, Callable, Dict, Optional

from . import RunConfig, ScalingConfig
from .._results import Result, TrainingFailedError


class _Trainer:
    """A data-parallel run of ``train_loop_per_worker`` (Ray's ``DataParallelTrainer``)."""

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: Optional[Dict[str, Any]] = None,
                 scaling_config: Optional[ScalingConfig] = None, run_config: Optional[RunConfig] = None,
                 datasets: Optional[Dict[str, Any]] = None, resume_from_checkpoint: Any = None, metadata: Any = None,
                 dataset_config: Any = None, **_framework: Any):
        if not callable(train_loop_per_worker):
            raise TypeError(f"train_loop_per_worker must be a function, not {type(train_loop_per_worker).__name__}")
        if datasets:
            raise ValueError(
                "datasets= takes Ray Data datasets, which nestor does not have: load the data inside "
                "train_loop_per_worker (nestor.train.torch.prepare_data_loader shards a DataLoader across the workers)"
            )
        if resume_from_checkpoint is not None:
            raise ValueError("resume_from_checkpoint= was removed from Ray Train; continue a run with Tuner.restore instead")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = dict(train_loop_config or {})
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config
        self.__name__ = type(self).__name__

    def _parts(self) -> Dict[str, Any]:
        return {
            "blob": {"kind": "trainer", "fn": self.train_loop_per_worker, "train_loop_config": self.train_loop_config},
            "scaling": self.scaling_config,
            "run_config": self.run_config,
            "train_loop_config": self.train_loop_config,
        }

    def fit(self) -> Result:
        """Runs the training function once on every worker; returns its
        result, or raises ``TrainingFailedError`` naming the failed rank, its
        node and its traceback."""
        from ..tune import TuneConfig, Tuner

        grid = Tuner(self, tune_config=TuneConfig(num_samples=1)).fit()
        result = grid[0]
        if result.error is not None:
            raise result.error
        return result
