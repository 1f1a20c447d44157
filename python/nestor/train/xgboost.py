"""Ray Train's ``ray.train.xgboost`` for nestor: ``XGBoostTrainer`` (a
training function on every rank, inside XGBoost's collective, so the ranks
train one model on their shares of the data), ``XGBoostConfig`` (the
backend that starts the collective's tracker) and ``RayTrainReportCallback``
(the round's eval metrics reported every round, the booster as the
checkpoint). Built on ``nestor.train.backend``, as a third party would.

xgboost is imported on first use (``pip install "nestor[xgboost]"``)."""

import os
import tempfile
from typing import Any, Callable, Dict, List, Optional, Union

from ._framework import older_form_params
from .backend import Backend, BackendConfig
from .data_parallel_trainer import DataParallelTrainer

__all__ = ["RayTrainReportCallback", "XGBoostConfig", "XGBoostTrainer"]


def _xgboost() -> Any:
    from ._framework import need

    return need("xgboost", "xgboost")


#: This rank's collective settings (``on_training_start`` sets them, the
#: function's context uses them), and rank 0's tracker.
_worker_args: Dict[str, Any] = {}
_tracker: List[Any] = []


def _start_tracker(n_workers: int, host: str) -> Dict[str, Any]:
    from xgboost.tracker import RabitTracker

    tracker = RabitTracker(n_workers=n_workers, host_ip=host, sortby="task")
    tracker.start()
    _tracker.append(tracker)
    return dict(tracker.worker_args())


class _XGBoostBackend(Backend):
    def on_training_start(self, worker_group: Any, backend_config: "XGBoostConfig") -> None:
        _worker_args.clear()
        if len(worker_group) <= 1:
            return
        _xgboost()
        # Rank 0 starts the tracker on its node; every rank joins it, ordered by rank.
        args = worker_group.execute_single(0, _start_tracker, len(worker_group), worker_group.node_ip)
        _worker_args.update(args, dmlc_task_id=f"[xgboost.ray-rank={worker_group.rank:08d}]")

    def on_shutdown(self, worker_group: Any, backend_config: "XGBoostConfig") -> None:
        _worker_args.clear()
        while _tracker:
            tracker = _tracker.pop()
            try:
                tracker.wait_for(timeout=10)
                tracker.free()
            except Exception:
                pass


class XGBoostConfig(BackendConfig):
    """XGBoost's collective for the ranks of a run (Ray's
    ``XGBoostConfig``): rank 0 starts a ``RabitTracker`` on its node, and the
    training function runs inside ``xgboost.collective.CommunicatorContext``."""

    def __init__(self, xgboost_communicator: str = "rabit"):
        if xgboost_communicator != "rabit":
            raise ValueError(f"XGBoostConfig(xgboost_communicator={xgboost_communicator!r}): nestor runs 'rabit' (on CPUs and GPUs)")
        self.xgboost_communicator = xgboost_communicator

    @property
    def backend_cls(self) -> Any:
        return _XGBoostBackend

    @property
    def train_func_context(self) -> Callable[[], Any]:
        def context() -> Any:
            import contextlib

            if not _worker_args:
                return contextlib.nullcontext()
            return _xgboost().collective.CommunicatorContext(**_worker_args)

        return context


class XGBoostTrainer(DataParallelTrainer):
    """Ray Train V2's ``XGBoostTrainer(train_loop_per_worker, ...)``: the
    function runs on every rank inside XGBoost's collective, so
    ``xgboost.train`` on each rank's ``DMatrix`` trains one model across
    the ranks. Ray's older form, ``XGBoostTrainer(params=..., label_column=...,
    num_boost_round=..., datasets={"train": ..., "valid": ...})``, is this
    with a training function nestor writes (``RayTrainReportCallback``
    reporting every round, a checkpoint at the end)."""

    def __init__(self, train_loop_per_worker: Optional[Callable[..., Any]] = None, *, train_loop_config: Optional[Dict[str, Any]] = None,
                 xgboost_config: Optional[XGBoostConfig] = None, scaling_config: Any = None, run_config: Any = None,
                 datasets: Optional[Dict[str, Any]] = None, params: Optional[Dict[str, Any]] = None,
                 label_column: Optional[str] = None, num_boost_round: int = 10, dmatrix_params: Optional[Dict[str, Any]] = None,
                 **kwargs: Any):
        if train_loop_per_worker is None:
            from ._framework import older_form

            train_loop_per_worker = _legacy_loop
            train_loop_config = older_form("XGBoostTrainer", "__xgboost__", train_loop_config, params, label_column, num_boost_round, datasets,
                                           {"dmatrix_params": dict(dmatrix_params or {})})
        super().__init__(train_loop_per_worker, backend_config=xgboost_config or XGBoostConfig(), train_loop_config=train_loop_config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets, **kwargs)

    @staticmethod
    def get_model(checkpoint: Any, filename: str = "model.ubj") -> Any:
        """The booster a checkpoint holds."""
        return _callback_class().get_model(checkpoint, filename)


def _legacy_loop(config: Dict[str, Any]) -> None:
    """Ray's older ``XGBoostTrainer(params=, label_column=, ...)``: every data
    set's share as a DMatrix, ``xgboost.train`` across the ranks, resumed
    from the trial's checkpoint, reported every round."""
    from . import get_checkpoint, get_dataset_shard

    xgb = _xgboost()
    settings = config["__xgboost__"]
    label = settings["label_column"]
    params, rounds = older_form_params(config, "__xgboost__")
    import nestor

    matrices = {}
    for name in sorted(nestor._datasets):
        frame = _frame(get_dataset_shard(name))
        matrices[name] = xgb.DMatrix(frame.drop(columns=[label]), label=frame[label], **settings["dmatrix_params"])
    booster, done = None, 0
    checkpoint = get_checkpoint()
    if checkpoint:
        booster = _callback_class().get_model(checkpoint)
        done = booster.num_boosted_rounds()
    xgb.train(params, matrices["train"], num_boost_round=max(rounds - done, 0),
              evals=[(m, n) for n, m in matrices.items()], xgb_model=booster, callbacks=[_callback_class()()])


def _frame(shard: Any) -> Any:
    import pandas as pd

    frames = list(shard.iter_batches(batch_size=None, batch_format="pandas"))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _callback_class() -> Any:
    """``RayTrainReportCallback``, an ``xgboost.callback.TrainingCallback``
    (made once, when first asked for: xgboost is imported then)."""
    if _CALLBACK:
        return _CALLBACK[0]
    xgb = _xgboost()

    class RayTrainReportCallback(xgb.callback.TrainingCallback):  # type: ignore[misc, name-defined]
        """An XGBoost callback (``xgb.train(..., callbacks=[RayTrainReportCallback()])``)
        that reports the round's eval metrics (``{"train-logloss": ...}``, or
        the names ``metrics`` maps to) every round, with the booster as a
        checkpoint (``filename``, saved by rank 0) every ``frequency`` rounds and
        at the end. A report of a stopped trial ends the training cleanly."""

        CHECKPOINT_NAME = "model.ubj"

        def __init__(self, metrics: Optional[Union[str, List[str], Dict[str, str]]] = None, filename: str = "model.ubj",
                     frequency: int = 0, checkpoint_at_end: bool = True, results_postprocessing_fn: Optional[Callable[..., Any]] = None):
            if isinstance(metrics, str):
                metrics = [metrics]
            self._metrics, self._filename, self._frequency = metrics, filename, int(frequency)
            self._at_end, self._post = checkpoint_at_end, results_postprocessing_fn
            self._last: Dict[str, float] = {}
            self._saved_at = -1

        @classmethod
        def get_model(cls, checkpoint: Any, filename: str = "model.ubj") -> Any:
            """The booster ``checkpoint`` holds."""
            xgb = _xgboost()
            with checkpoint.as_directory() as d:
                booster = xgb.Booster()
                booster.load_model(os.path.join(d, filename))
                return booster

        def _flat(self, evals_log: Dict[str, Dict[str, List[Any]]]) -> Dict[str, Any]:
            # The round's value of each "<data>-<metric>"; under xgboost.cv a (mean, std) pair,
            # given as it is to results_postprocessing_fn (as in Ray), else its mean.
            out: Dict[str, Any] = {f"{data}-{metric}": values[-1] for data, metrics in evals_log.items() for metric, values in metrics.items()}
            if isinstance(self._metrics, dict):
                out = {name: out[key] for name, key in self._metrics.items() if key in out}
            elif self._metrics:
                out = {k: v for k, v in out.items() if k in self._metrics}
            if self._post is not None:
                return self._post(out)
            return {k: float(v[0] if isinstance(v, tuple) else v) for k, v in out.items()}

        def _report(self, model: Any, metrics: Dict[str, float], with_checkpoint: bool) -> bool:
            from . import Checkpoint, get_context
            from .. import _report_or_stop

            if not hasattr(model, "save_model"):
                # xgboost.cv's folds: nothing to checkpoint, and no clean way out of its loop
                # (it reads an early stop's best round): a stopped trial's function ends here.
                from .. import report

                report(metrics)
                return True
            if not with_checkpoint:
                return _report_or_stop(metrics)
            with tempfile.TemporaryDirectory() as d:
                # Every rank holds the same booster; rank 0's copy is the checkpoint.
                if get_context().get_world_rank() == 0:
                    model.save_model(os.path.join(d, self._filename))
                    return _report_or_stop(metrics, Checkpoint.from_directory(d))
                return _report_or_stop(metrics)

        def after_iteration(self, model: Any, epoch: int, evals_log: Dict[str, Any]) -> bool:
            self._last = self._flat(evals_log)
            rounds = model.num_boosted_rounds() if hasattr(model, "num_boosted_rounds") else epoch + 1
            save = self._frequency > 0 and rounds % self._frequency == 0
            if save:
                self._saved_at = rounds
            # True stops the training: the trial was stopped.
            return not self._report(model, dict(self._last), save)

        def after_training(self, model: Any) -> Any:
            if not hasattr(model, "save_model"):
                return model  # xgboost.cv: every round was reported, and there is no one booster to save
            if self._at_end and self._saved_at != model.num_boosted_rounds():
                from .. import _stopped

                if not _stopped:
                    self._report(model, dict(self._last), True)
            return model

    _CALLBACK.append(RayTrainReportCallback)
    return RayTrainReportCallback


_CALLBACK: List[Any] = []


def __getattr__(name: str) -> Any:
    if name == "RayTrainReportCallback":
        return _callback_class()
    raise AttributeError(f"module 'nestor.train.xgboost' has no attribute {name!r}")
