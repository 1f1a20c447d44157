"""Ray Train's API for nestor (``ray.train``): inside a training function,
``report``, ``get_checkpoint`` and ``get_context``; around it, the configs a
trainer takes and the ``Result`` its ``fit()`` returns. ``TorchTrainer`` is in
``nestor.train.torch``."""

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from .. import PreemptionInfo, ReportError, TrainContext, _contract, get_preemption_info
from .. import get_context as _worker_context
from .. import report as _worker_report
from .._results import Result, TrainingFailedError
from .._callback import Callback as _TuneCallback
from .._checkpoint import Checkpoint
from ..data import DataConfig


@dataclass
class ScalingConfig:
    """How many workers a run has and what each needs (Ray's names)."""

    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Dict[str, float]] = None
    placement_strategy: str = "PACK"
    trainer_resources: Optional[Dict[str, float]] = None
    accelerator_type: Optional[str] = None
    use_tpu: bool = False
    topology: Optional[str] = None

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, tuple):
            raise ValueError("ScalingConfig(num_workers=(min, max)): elastic training is not in nestor; give a number")
        if self.use_tpu or self.topology:
            raise ValueError("ScalingConfig: TPUs are not supported by nestor")
        if self.accelerator_type:
            print(f"nestor: ScalingConfig(accelerator_type={self.accelerator_type!r}) is ignored: "
                  "nestor uses the GPUs of the machine or allocation it runs in", file=sys.stderr)

    def _trainer(self) -> Dict[str, Any]:
        t: Dict[str, Any] = {"num_workers": int(self.num_workers), "placement_strategy": self.placement_strategy}
        if self.use_gpu:
            t["use_gpu"] = True
        if self.resources_per_worker:
            t["resources_per_worker"] = _resources("resources_per_worker", self.resources_per_worker)
        if self.trainer_resources:
            t["trainer_resources"] = _resources("trainer_resources", self.trainer_resources)
        return t


def _resources(what: str, r: Dict[str, float]) -> Dict[str, float]:
    """Ray's resource names (``CPU``, ``GPU``, ``memory``; lower case too) as nestor's."""
    out: Dict[str, float] = {}
    for k, v in r.items():
        key = {"cpu": "CPU", "gpu": "GPU"}.get(k.lower(), k)
        out[key] = v
    return out


@dataclass
class CheckpointConfig:
    """Which checkpoints to keep: the best ``num_to_keep`` by ``checkpoint_score_attribute``."""

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: Optional[bool] = None

    def _table(self) -> Dict[str, Any]:
        t: Dict[str, Any] = {}
        if self.num_to_keep is not None:
            t["num_to_keep"] = int(self.num_to_keep)
        if self.checkpoint_score_attribute:
            t["score_attribute"] = self.checkpoint_score_attribute
            t["score_order"] = self.checkpoint_score_order
        if self.checkpoint_frequency:
            t["frequency"] = int(self.checkpoint_frequency)
        return t


@dataclass
class FailureConfig:
    """Restarts after a failed run (``max_failures``, -1 for no limit).

    ``max_infrastructure_failures`` (nestor's own, default 5) counts the runs
    the infrastructure ended (a node lost under them, a preemption, a time
    limit) apart from those; Ray's ``max_preemption_failures`` is the same
    budget. ``relax_collectives_on_preemption`` and ``preemption_grace_s``
    are taken and change nothing: a run the cluster ends goes on whole from
    its latest checkpoint.
    """

    max_failures: int = 0
    fail_fast: Union[bool, str] = False
    max_infrastructure_failures: Optional[int] = None
    max_preemption_failures: Optional[int] = None
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: Optional[float] = None
    controller_failure_limit: Optional[int] = None

    def __post_init__(self) -> None:
        if self.max_preemption_failures is not None:
            if self.max_infrastructure_failures is not None and self.max_infrastructure_failures != self.max_preemption_failures:
                raise ValueError("FailureConfig: max_preemption_failures and max_infrastructure_failures are the same budget "
                                 "in nestor; give one")
            self.max_infrastructure_failures = self.max_preemption_failures


#: The data set Ray's trainers train on (``datasets={TRAIN_DATASET_KEY: ds}``).
TRAIN_DATASET_KEY = "train"


@dataclass
class SyncConfig:
    """Ray's ``SyncConfig``: nestor writes results and checkpoints straight
    to ``storage_path`` (a directory or a bucket), so there is nothing to
    sync; it is accepted and set aside."""

    sync_period: int = 300
    sync_timeout: int = 1800
    sync_artifacts: bool = False
    sync_artifacts_on_checkpoint: bool = True
    upload_dir: Any = None
    syncer: Any = None
    sync_on_checkpoint: Any = None


@dataclass
class RunConfig:
    """Where a run's results go and when it stops (Ray's names)."""

    name: Optional[str] = None
    storage_path: Optional[str] = None
    storage_filesystem: Any = None
    failure_config: Optional[FailureConfig] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    stop: Optional[Union[Dict[str, float], Callable[..., Any]]] = None
    callbacks: Optional[List[Any]] = None
    verbose: Optional[int] = None
    progress_reporter: Any = None
    log_to_file: Any = None
    sync_config: Any = None

    def __post_init__(self) -> None:
        if self.storage_filesystem is not None:
            raise ValueError("RunConfig(storage_filesystem=...): give storage_path as a URL (s3://bucket/prefix) instead; "
                             "credentials come from the provider's environment variables")
        if self.stop is not None and not isinstance(self.stop, dict) and not callable(self.stop):
            raise ValueError(f"RunConfig(stop={self.stop!r}): give a dict ({{metric: threshold}}), a function "
                             "(trial_id, result) -> bool or a tune.stopper.Stopper")
        from .._callback import Callback

        others = [c for c in self.callbacks or [] if not isinstance(c, Callback)]
        if others:
            names = ", ".join(type(c).__name__ for c in others)
            raise ValueError(f"RunConfig(callbacks=[{names}]): give tune.Callback (or tune.logger.LoggerCallback) "
                             "subclasses, or nestor's loggers (nestor.tune.logger, nestor.air.integrations)")
        for k in ("verbose", "progress_reporter", "log_to_file", "sync_config"):
            if getattr(self, k) is not None:
                print(f"nestor: RunConfig({k}=...) is ignored: nestor shows its own progress and keeps every rank's log",
                      file=sys.stderr)


def get_context() -> TrainContext:
    """This worker's context: ranks, sizes, trial, experiment (``nestor.get_context()``'s)."""
    return _worker_context()


def get_checkpoint() -> Optional[Checkpoint]:
    """The checkpoint this run resumes from, or None on a fresh start. Its
    ``as_directory()`` shows every rank's files of it (a sharded checkpoint,
    ``torch.distributed.checkpoint``'s, loads whole, into any number of
    ranks), this rank's own on top where names clash, then rank 0's; its
    ``path`` is this rank's files alone (rank 0's where it saved none). On
    a node that does not see the driver's directories, the other ranks'
    files are fetched from the driver when first asked for."""
    from .. import get_checkpoint as _worker_checkpoint

    path = _worker_checkpoint()
    if not path:
        return None
    checkpoint = Checkpoint(path)
    checkpoint._rank = _worker_context().world_rank
    plan = _contract.plan()
    if plan and plan.back.get("kind") in ("driver", "store"):
        checkpoint._whole = _fetch_whole
    return checkpoint


_whole: Optional[str] = None


def _fetch_whole() -> Optional[str]:
    """Every rank's part of the checkpoint this run resumes from, once: from
    the object store where it lies there (the plan's ``store`` route), else,
    or where this node cannot download it, from the driver (a node that does
    not see the driver's directories)."""
    global _whole
    if _whole is None:
        from .. import _get_channel

        back = _contract.plan().back
        _whole = (_download_whole(back) if back.get("kind") == "store" else None) or ""
        if not _whole:
            _whole = _get_channel().fetch_shard(_worker_context(), whole=True) or ""
    return _whole or None


def _download_whole(back: Dict[str, Any]) -> Optional[str]:
    """The checkpoint ``back["uri"]``, every rank's ``rank-<r>/``, downloaded
    with ``nestor fetch`` into a temporary directory; None where it cannot be."""
    import atexit
    import shutil
    import subprocess
    import tempfile

    dest = tempfile.mkdtemp(prefix="nestor-whole-")
    atexit.register(shutil.rmtree, dest, True)
    binary = back.get("uploader")
    if not binary:
        from .. import _binary

        binary = _binary.find()
    out = subprocess.run([binary, "fetch", back["uri"], dest], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        print(f"nestor: cannot download {back['uri']} ({out.stderr.strip()}); it comes through the driver", file=sys.stderr, flush=True)
        shutil.rmtree(dest, ignore_errors=True)
        return None
    return dest


def report(metrics: Dict[str, Any], checkpoint: Optional[Union[Checkpoint, str]] = None, checkpoint_dir_name: Optional[str] = None,
           **_ignored: Any) -> None:
    """Reports one step of this rank (every rank, every step; rank 0's
    metrics are the trial's), and a checkpoint directory, copied into the
    trial's storage before this returns (with the trainer's ``metadata=``
    in its metadata; with ``checkpoint_dir_name``, also linked under that
    name in the experiment's directory). Raises ``SystemExit(0)`` when the
    scheduler stops the trial; nestor ends the worker cleanly then."""
    if checkpoint_dir_name is not None:
        name = str(checkpoint_dir_name)
        if not name or "/" in name or name in (".", "..") or any(ord(c) < 32 for c in name):
            raise ValueError(f"report(checkpoint_dir_name={checkpoint_dir_name!r}): give a plain directory name")
    for key in _ignored:
        _note_once(f"report({key}=...) is ignored")
    import nestor

    if checkpoint is not None and nestor._metadata:
        # The trainer's metadata= rides with every checkpoint it saves, as in Ray.
        checkpoint = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint(os.fspath(checkpoint))
        checkpoint.update_metadata(dict(nestor._metadata))
    _worker_report(metrics, checkpoint=checkpoint)
    if checkpoint is not None and checkpoint_dir_name is not None:
        _name_checkpoint(str(checkpoint_dir_name))


def _name_checkpoint(name: str) -> None:
    """Ray Train V2 keeps a report's checkpoint at ``<storage>/<name>/<checkpoint_dir_name>``:
    nestor keeps it in the trial's ``checkpoint_NNNNNN`` and, from rank 0,
    links that name in the experiment's directory to it (local storage), so
    code that reads it there finds it."""
    import nestor

    ctx = _worker_context()
    channel = nestor._channel
    iteration = getattr(channel, "last_iteration", None) if channel is not None else None
    if ctx.world_rank != 0 or iteration is None or not ctx.trial_dir:
        return
    checkpoint_dir = os.path.join(ctx.trial_dir, f"checkpoint_{iteration:06d}")
    exp_dir = os.path.dirname(os.path.dirname(ctx.trial_dir))
    if not os.path.isdir(checkpoint_dir):
        _note_once(f"report(checkpoint_dir_name={name!r}): the checkpoint is in the experiment's storage (not this "
                   "node's directories); Result.checkpoint finds it")
        return
    link = os.path.join(exp_dir, name)
    tmp = f"{link}.{os.getpid()}.tmp"
    try:
        os.symlink(os.path.relpath(checkpoint_dir, exp_dir), tmp)
        os.replace(tmp, link)
    except OSError as e:
        _note_once(f"report(checkpoint_dir_name={name!r}): cannot link {link}: {e}")


_noted: set = set()


def _note_once(what: str) -> None:
    if what not in _noted:
        _noted.add(what)
        print(f"nestor: {what}", file=sys.stderr)


_shards: Dict[str, Any] = {}


def get_dataset_shard(name: Optional[str] = None) -> Any:
    """This worker's share of the data set ``name``: the trainer's
    ``datasets=``, or the experiment file's ``[datasets]``. A
    ``DataIterator`` whose ``iter_batches()`` / ``iter_torch_batches()``
    each read the next epoch. Epochs are counted from the iterations
    already done, so a restarted run reads its checkpoint's epoch in that
    epoch's order (one report an epoch)."""
    import nestor

    plans = nestor._datasets or _experiment_datasets()
    if "__per_rank__" in plans:
        # A custom DataConfig.configure said what each worker reads.
        plans = plans["__per_rank__"][_worker_context().world_rank]
        if name is None and len(plans) == 1:
            name = next(iter(plans))
        if name not in plans:
            known = ", ".join(sorted(plans)) or "none"
            raise KeyError(f"get_dataset_shard({name!r}): the DataConfig's configure gave this worker no such data set (it has {known})")
        return plans[name]
    if name is None and len(plans) == 1:
        name = next(iter(plans))
    if name not in plans:
        known = ", ".join(sorted(plans)) or "none"
        raise KeyError(f"get_dataset_shard({name!r}): the trainer's datasets= (or the experiment's [datasets]) has no "
                       f"such data set (it has {known})")
    if name not in _shards:
        from ..data import DataIterator

        ctx = _worker_context()
        _shards[name] = DataIterator(plans[name], ctx.world_rank, ctx.world_size, epoch=ctx.start_iteration)
    return _shards[name]


def _experiment_datasets() -> Dict[str, Any]:
    """The plans of the experiment file's ``[datasets]`` (the run's plan
    names their file), fetched from the driver by a node that does not see it."""
    import nestor

    plan = _contract.plan()
    path = plan.datasets if plan else None
    if not path:
        return {}
    from ..data._blocks import _plans_from_json

    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    else:
        fetched = nestor._get_channel().fetch_file(_worker_context(), path)
        with open(fetched) as f:
            text = f.read()
    nestor._datasets = _plans_from_json(text, path)
    return nestor._datasets


class UserCallback(_TuneCallback):
    """Ray Train V2's callback (``ray.train.UserCallback``) for a trainer's
    ``RunConfig(callbacks=[...])``: ``after_report`` gets each result as a
    list of every rank's metrics (rank 0's first: the trial's result, with
    nestor's own keys; the other ranks' as they reported them) with its
    checkpoint, ``after_exception`` the failure. It runs in the script's
    process like Tune's callbacks (``nestor.tune.callback``)."""

    def after_report(self, run_context: Any, metrics: List[Dict[str, Any]], checkpoint: Optional[Checkpoint]) -> None:
        """A result of the run, durable, with its checkpoint (None without)."""

    def after_exception(self, run_context: Any, worker_exceptions: Dict[int, Exception]) -> None:
        """The run failed: the failure, by rank (the rank is 0 when nestor does not know it)."""

    def on_trial_result(self, iteration: int, trials: List[Any], trial: Any, result: Dict[str, Any], **info: Any) -> None:
        checkpoint = Checkpoint(result["checkpoint"]) if result.get("checkpoint") else None
        ranks = result.get("rank_metrics")
        result = {k: v for k, v in result.items() if k != "rank_metrics"}
        metrics = [result] + [dict(m) for m in ranks[1:]] if isinstance(ranks, list) and ranks else [result]
        self.after_report(None, metrics, checkpoint)

    def on_trial_error(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        self.after_exception(None, {0: TrainingFailedError(f"trial {trial.trial_id} failed: {trial.error}")})


#: Ray's framework packages under ``ray.train``, loaded when first named
#: (``import ray.train`` then ``ray.train.lightning.RayDDPStrategy()``
#: works in Ray's scripts; so it does here, without importing every framework up front).
_SUBPACKAGES = ("torch", "lightning", "xgboost", "lightgbm", "tensorflow", "huggingface", "backend", "data_parallel_trainer",
                "horovod", "collective", "context", "error", "base_trainer", "trainer")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SyncConfig", "TRAIN_DATASET_KEY", "Checkpoint", "CheckpointConfig", "DataConfig", "FailureConfig", "Result", "RunConfig", "ScalingConfig", "TrainContext",
    "TrainingFailedError", "UserCallback", "get_checkpoint", "get_context", "get_dataset_shard", "report", "ReportError",
    "PreemptionInfo", "get_preemption_info",
]
