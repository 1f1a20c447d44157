"""nestor's worker client: what a training process started by ``nestor run``
calls to learn its trial and to report each step (Ray Train's
``ray.train`` functions, for nestor).

Every rank of a trial calls :func:`report` once per step; rank 0's metrics
are the trial's. Outside nestor (no run plan, ``NESTOR_RUN``) the same calls work
locally: :func:`report` prints the metrics to stderr and returns.
"""

import json
import math
import numbers
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from . import _client, _contract
from ._client import PreemptionInfo, ReportError, run_plan as _plan
from ._settings import SlurmJobs, init, is_initialized, shutdown

# gRPC's fork handling off, before gRPC is imported: a rank that forks
# (a DataLoader's workers) while gRPC's threads are busy would leave the
# child's gRPC broken, and the child dies. The children never use gRPC.
# nestor's ranks get the same setting in their environment.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__all__ = ["TrainContext", "ReportError", "PreemptionInfo", "SlurmJobs", "get_context", "get_config", "get_checkpoint", "get_preemption_info",
           "report"]
__version__ = "0.1.0"


@dataclass(frozen=True)
class TrainContext:
    """Who this worker is: Ray Train's ``TrainContext`` (``nestor.get_context()``
    and ``nestor.train.get_context()`` give the same one)."""

    world_rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    trial_id: str
    trial_dir: str
    config: Dict[str, Any] = field(default_factory=dict)
    #: Iterations already done when this run started (those of the
    #: checkpoint it resumed from); its first report is iteration
    #: ``start_iteration + 1``.
    start_iteration: int = 0
    #: How often, in iterations, to save a checkpoint (``[checkpoint]
    #: frequency``); 0 leaves it to the training code.
    checkpoint_frequency: int = 0

    def should_checkpoint(self, iteration: int) -> bool:
        """Whether ``iteration`` should carry a checkpoint under ``checkpoint_frequency``."""
        return self.checkpoint_frequency > 0 and iteration % self.checkpoint_frequency == 0

    def get_world_rank(self) -> int:
        return self.world_rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_trial_id(self) -> str:
        return self.trial_id

    def get_trial_name(self) -> str:
        return self.trial_id

    def get_trial_dir(self) -> str:
        return self.trial_dir

    def get_experiment_name(self) -> str:
        plan = _plan()
        return plan.experiment_name if plan else ""

    def get_storage(self) -> str:
        """Where the experiment's checkpoints go (a directory or a URL)."""
        plan = _plan()
        return plan.storage_path if plan else ""

    def get_trial_resources(self) -> Any:
        """What this rank was given, as Ray gives it (a ``PlacementGroupFactory``; ``["CPU"]`` reads it as a dict)."""
        from ._resources import this_trials

        return this_trials()

    def get_config(self) -> Dict[str, Any]:
        return dict(self.config)

    def get_metadata(self) -> Dict[str, Any]:
        """The trainer's ``metadata=`` dict (empty without one), as in Ray."""
        return dict(_metadata)

    def get_preemption_info(self) -> "Optional[PreemptionInfo]":
        """None, until the cluster says it will end this run soon: see :func:`get_preemption_info`."""
        return get_preemption_info()


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ReportError(f"{name}={value!r} is not a number") from None


_context: Optional[TrainContext] = None


def get_context() -> TrainContext:
    """This worker's rank, world size, trial and config."""
    global _context
    if _context is None:
        plan = _plan()
        if plan and plan.out_after_upload().get("kind") == "ship" and plan.trial_dir:
            # The trial's directory is the driver's: on a node that does not see it, one of the same path, made here.
            os.makedirs(plan.trial_dir, exist_ok=True)
        rank = _int_env("RANK", 0)
        world = _int_env("WORLD_SIZE", plan.world_size if plan else 1)
        _context = TrainContext(
            world_rank=rank,
            local_rank=_int_env("LOCAL_RANK", rank),
            world_size=world,
            local_world_size=_int_env("LOCAL_WORLD_SIZE", world),
            node_rank=_int_env("NODE_RANK", 0),
            trial_id=plan.trial_id if plan else "local",
            trial_dir=(plan.trial_dir or os.getcwd()) if plan else os.getcwd(),
            config=dict(plan.config) if plan else {},
            start_iteration=plan.start_iteration if plan else 0,
            checkpoint_frequency=plan.checkpoint_frequency if plan else 0,
        )
    return _context


def get_config() -> Dict[str, Any]:
    """The trial's hyperparameters (a dict; nested tables are nested dicts)."""
    return get_context().config


def get_preemption_info() -> Optional[PreemptionInfo]:
    """None, until the cluster says it will end this run soon (a Slurm job
    of its own nearing its time limit: ``[cluster.jobs] signal_s``); then
    when and which ranks. Slurm tells every rank of the job at once, and
    the ranks move in step (each report waits for all of them), so they see
    it at the same step, as with Ray's. The answer is to save a checkpoint
    with the next report: the trial goes on from it."""
    at = _client.preempted_at()
    if at is None:
        return None
    ctx = get_context()
    plan = _plan()
    notice = float((plan.preemption or {}).get("notice_s", 0)) if plan else 0.0
    return PreemptionInfo(world_ranks=list(range(ctx.world_size)), deadline=at + notice,
                          reason="the job nears its time limit, or is being preempted")



_fetched: Optional[str] = None


def get_checkpoint() -> Optional[str]:
    """A local directory holding this rank's checkpoint to resume from, or None
    on a fresh start. On a node that does not see the driver's directories
    the shard is fetched from the driver (the plan's ``driver`` route), and
    where the checkpoint lies in an object store this rank reaches, from
    there (``store``; a rank that cannot reach it gets its shard from the
    driver, which downloads it then): into a temporary directory first,
    once, removed when the process exits."""
    global _fetched
    plan = _plan()
    kind = plan.back.get("kind") if plan else "none"
    if kind in ("driver", "store"):
        if _fetched is None:
            ctx = get_context()
            _fetched = (_get_channel().fetch_shard(ctx) if kind == "driver" else _download_or_ask(plan.back, ctx)) or ""
        return _fetched or None
    path = plan.shard_path(get_context().world_rank) if plan and kind == "local" else _resume_from
    if path and os.path.isdir(path):
        return path
    return None


#: A trainer's ``resume_from_checkpoint`` (this rank's shard), where its run has none of its own.
_resume_from: Optional[str] = None


def _download_or_ask(back: Dict[str, Any], ctx: TrainContext) -> Optional[str]:
    """This rank's shard from the object store, or, where this node cannot
    download it, from the driver (which downloads it for the ranks that ask)."""
    try:
        return _download(back, ctx)
    except ReportError as e:
        print(f"nestor: rank {ctx.world_rank} {e}; it comes through the driver", file=sys.stderr, flush=True)
        return _get_channel().fetch_shard(ctx)


def _download(back: Dict[str, Any], ctx: TrainContext) -> Optional[str]:
    """This rank's shard of the checkpoint ``back["uri"]`` (an object store),
    downloaded with ``nestor get-shard`` (the store's credentials from the
    environment) into a temporary directory; None when it holds none."""
    import atexit
    import shutil
    import subprocess
    import tempfile

    dest = tempfile.mkdtemp(prefix=f"nestor-{ctx.trial_id}-rank-{ctx.world_rank}-")
    atexit.register(shutil.rmtree, dest, True)
    uploader = back.get("uploader")
    if not uploader:
        from . import _binary

        uploader = _binary.find()
    out = subprocess.run([uploader, "get-shard", back["uri"], dest, "--rank", str(ctx.world_rank)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise ReportError(f"cannot fetch the checkpoint to resume from ({back['uri']}): {out.stderr.strip()}")
    return dest if out.stdout.strip() == "fetched" else None


def _metrics(metrics: Mapping[str, Any]) -> "tuple[Dict[str, float], Dict[str, Any]]":
    """The report's numbers (metrics: a scheduler may use them) and its other
    values (strings, booleans, lists, dicts: kept with the result, as Ray
    keeps them)."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"nestor.report: metrics must be a dict of name -> value, not {type(metrics).__name__}")
    numbers_, extra = {}, {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"nestor.report: metric names must be non-empty strings, got {name!r}")
        if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
            value = value.item()  # a 0-d tensor or numpy scalar
        elif hasattr(value, "tolist") and callable(value.tolist):
            value = value.tolist()  # an array or tensor
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            numbers_[name] = float(value)
            continue
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise TypeError(
                f"nestor.report: {name!r} is {type(value).__name__} {value!r}: neither a number nor a JSON value "
                "(string, boolean, list, dict; no NaN inside)"
            ) from None
        extra[name] = value
    return numbers_, extra


#: This rank's channel to the driver, opened on first use.
_channel: Optional[_client.Channel] = None


def _get_channel() -> "_client.Channel":
    global _channel
    if _channel is None:
        _channel = _client.Channel()
    return _channel


def report(metrics: Mapping[str, Any], checkpoint: Optional[Any] = None) -> None:
    """Reports one step of this rank: metrics (name -> number, NaN allowed;
    values that are not numbers, such as strings, lists and dicts, are kept
    with the result but are never a scheduler's metric) and
    optionally a directory holding this step's checkpoint (copied before this
    returns, so it may be reused). Blocks until every rank has reported the
    step and the driver has stored it and decided (it is durable with the
    driver's next group commit, a moment later); raises ``SystemExit(0)``
    when the trial must stop, so training ends cleanly."""
    global _stopped
    if _stopped:
        raise SystemExit(0)  # the trial was stopped at an earlier report: nothing more is taken
    values, extra = _metrics(metrics)
    path = ""
    if checkpoint is not None:
        path = os.fspath(getattr(checkpoint, "path", checkpoint))
        if not os.path.isdir(path):
            raise ReportError(f"nestor.report: checkpoint {path} is not a directory")
        path = os.path.abspath(path)
    ctx = get_context()
    if not _contract.inside():
        shown = {**{k: (v if math.isfinite(v) else str(v)) for k, v in values.items()}, **extra}
        print(f"nestor (local): rank {ctx.world_rank}: {json.dumps(shown)}" + (f" checkpoint={path}" if path else ""), file=sys.stderr)
        return
    directive = _get_channel().report(ctx, values, path, extra)
    if directive != 1:
        _stopped = True
        raise SystemExit(0)


#: The data sets of this worker's trainer (``datasets=``, or the experiment
#: file's ``[datasets]``), planned by the driver: name -> plan.
_datasets: Dict[str, Any] = {}

#: The trainer's ``metadata=`` (``get_context().get_metadata()``).
_metadata: Dict[str, Any] = {}

#: Whether a report was answered "stop": a framework's callback that caught
#: the ``SystemExit`` to end its loop cleanly leaves any later report a no-op exit.
_stopped = False


def _report_or_stop(metrics: Mapping[str, Any], checkpoint: Optional[Any] = None) -> bool:
    """:func:`report` for a framework's callback: False, not ``SystemExit``,
    when the trial must stop, so the framework can end its loop itself
    (every rank hears the same answer at the same step: none is left
    waiting in a collective)."""
    try:
        report(metrics, checkpoint)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
        return False
    return True


def __getattr__(name: str) -> Any:
    # nestor.train and nestor.tune load on first use, so a worker that only
    # reports never imports the driver's modules.
    if name in ("train", "tune", "air"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name in ("get", "put", "remote", "wait"):
        raise AttributeError(f"nestor has no {name}(): it runs training functions, not Ray tasks; call the function directly")
    raise AttributeError(f"module 'nestor' has no attribute {name!r}")


# Ray's public names under nestor's same paths: nestor's own, or refused by name when used (nestor._ray_api).
from . import _ray_api as _ray_api_names  # noqa: E402

_ray_api_names.install()
