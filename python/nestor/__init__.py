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
from typing import Any, Dict, List, Mapping, Optional

from . import _contract

# gRPC's fork handling off, before gRPC is imported: a rank that forks
# (a DataLoader's workers) while gRPC's threads are busy would leave the
# child's gRPC broken, and the child dies. The children never use gRPC.
# nestor's ranks get the same setting in their environment.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__all__ = ["TrainContext", "ReportError", "PreemptionInfo", "SlurmJobs", "get_context", "get_config", "get_checkpoint", "get_preemption_info",
           "report"]
__version__ = "0.1.0"


class ReportError(RuntimeError):
    """The driver refused a report (bad input, wrong token) or cannot be reached."""


@dataclass(frozen=True)
class TrainContext:
    """Who this worker is: Ray Train's ``TrainContext``."""

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

    def get_trial_dir(self) -> str:
        return self.trial_dir


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


def _plan() -> "Optional[_contract.Plan]":
    """This rank's run plan (``NESTOR_RUN``), or None outside nestor."""
    try:
        return _contract.plan()
    except _contract.PlanError as e:
        raise ReportError(str(e)) from None


def get_config() -> Dict[str, Any]:
    """The trial's hyperparameters (a dict; nested tables are nested dicts)."""
    return get_context().config


@dataclass(frozen=True)
class PreemptionInfo:
    """The run is about to be ended by its cluster (Ray's ``PreemptionInfo``):
    its job nears its time limit, or is being preempted. Save a checkpoint
    now; the trial goes on from it in a new job."""

    #: The ranks that will be ended (all of the run's: the job ends whole).
    world_ranks: List[int]
    #: When, as ``time.time()`` reckons, the job will be ended at the latest.
    deadline: float
    #: Why, in words.
    reason: str


_preempted_at: Optional[float] = None


def _on_preemption_signal(signum: int, frame: Any) -> None:
    global _preempted_at
    if _preempted_at is None:
        import time

        _preempted_at = time.time()
        print("nestor: the cluster will end this job soon (its time limit, or preemption): checkpoint now", file=sys.stderr,
              flush=True)


def _watch_preemption() -> None:
    """Under a Slurm job of its own, nestor asks Slurm for SIGUSR1 some time
    before the job's limit (``NESTOR_PREEMPTION_SIGNAL``): recorded here for
    :func:`get_preemption_info`, instead of its default, which ends the process."""
    plan = _plan()
    if not plan or not plan.preemption or plan.preemption.get("signal") != "USR1":
        return
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, _on_preemption_signal)


def get_preemption_info() -> Optional[PreemptionInfo]:
    """None, until the cluster says it will end this run soon (a Slurm job
    of its own nearing its time limit: ``[cluster.jobs] signal_s``); then
    when and which ranks. Slurm tells every rank of the job at once, and
    the ranks move in step (each report waits for all of them), so they see
    it at the same step, as with Ray's. The answer is to save a checkpoint
    with the next report: the trial goes on from it."""
    if _preempted_at is None:
        return None
    ctx = get_context()
    plan = _plan()
    notice = float((plan.preemption or {}).get("notice_s", 0)) if plan else 0.0
    return PreemptionInfo(world_ranks=list(range(ctx.world_size)), deadline=_preempted_at + notice,
                          reason="the job nears its time limit, or is being preempted")


_watch_preemption()


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


def _open_channel(grpc, addr, target):
    """The channel to the driver: TLS when its address is ``https://``
    (ranks on other machines), trusting only the certificate authority the
    driver made for itself (the plan's ``tls_ca``) and checking the name its
    certificate is made out to, whatever host the address names."""
    if not addr.startswith("https://"):
        return grpc.insecure_channel(target)
    ca = _plan().tls_ca
    if not ca.strip():
        raise ReportError(f"the driver's address {addr!r} is TLS, but the run's plan names no certificate authority (tls_ca)")
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.encode())
    return grpc.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", "nestor-report")])


class _Channel:
    def __init__(self):
        import grpc

        from . import _proto

        addr = _plan().addr
        target = addr.split("://", 1)[1] if "://" in addr else addr
        self._grpc = grpc
        self._proto = _proto
        self._channel = _open_channel(grpc, addr, target)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=float(os.environ.get("NESTOR_CONNECT_TIMEOUT_S", "30")))
        except grpc.FutureTimeoutError:
            raise ReportError(f"cannot reach the nestor driver at {addr}") from None
        self._call = self._channel.unary_unary(
            _proto.REPORT_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=_proto.ReportReply.FromString,
        )
        self._token = _contract.token()
        self._addr = addr
        self._reports = 0  # reports taken so far: the next one is iteration start + this + 1
        self._put = self._channel.stream_unary(
            _proto.PUT_SHARD_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=_proto.ShardReceipt.FromString,
        )
        self._meet = self._channel.unary_unary(
            _proto.RENDEZVOUS_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=_proto.RendezvousReply.FromString,
        )
        self._get = self._channel.unary_stream(
            _proto.GET_SHARD_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=_proto.ShardChunk.FromString,
        )
        self._get_file = self._channel.unary_stream(
            _proto.GET_FILE_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=_proto.ShardChunk.FromString,
        )

    def book(self, ctx: TrainContext, scaling: Dict[str, Any]) -> List[Dict[str, Any]]:
        """Books a trainer's resources (``ScalingConfig._trainer()``'s keys)
        in place of this trial's own bundle; waits until they are granted and
        returns the bundles. A request that can never fit raises ValueError."""
        request = self._proto.BookRequest(
            version=self._proto.PROTOCOL_VERSION, trial_id=ctx.trial_id, token=self._token, rank=ctx.world_rank,
            num_workers=int(scaling.get("num_workers", 1)), use_gpu=bool(scaling.get("use_gpu", False)),
            placement_strategy=str(scaling.get("placement_strategy", "PACK")),
        )
        request.resources_per_worker.update(scaling.get("resources_per_worker") or {})
        request.trainer_resources.update(scaling.get("trainer_resources") or {})
        call = self._channel.unary_unary(
            self._proto.BOOK_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self._proto.BookReply.FromString,
        )
        try:
            reply = call(request, wait_for_ready=True)
        except self._grpc.RpcError as e:
            if e.code() in (self._grpc.StatusCode.FAILED_PRECONDITION, self._grpc.StatusCode.INVALID_ARGUMENT):
                raise ValueError(e.details()) from None
            raise ReportError(f"booking the trainer's resources failed ({e.code().name}): {e.details()}") from None
        return [{"cpus": w.cpus, "gpus": list(w.gpus), "gpu_share": w.gpu_share, "memory_bytes": w.memory_bytes,
                 "custom": dict(w.custom)} for w in reply.workers]

    def rendezvous(self, ctx: TrainContext, address: str, timeout: float) -> str:
        """Rank 0 posts ``address`` (its store's ``host:port``); the other
        ranks get it once posted."""
        request = self._proto.RendezvousRequest(
            version=self._proto.PROTOCOL_VERSION, trial_id=ctx.trial_id, token=self._token, rank=ctx.world_rank, address=address
        )
        try:
            return self._meet(request, timeout=timeout, wait_for_ready=True).address
        except self._grpc.RpcError as e:
            raise ReportError(f"rendezvous through the driver failed ({e.code().name}): {e.details()}") from None

    def _chunks(self, ctx: TrainContext, root: str):
        """The files below ``root`` as shard chunks, the sender in the first."""
        head = dict(version=self._proto.PROTOCOL_VERSION, trial_id=ctx.trial_id, token=self._token, rank=ctx.world_rank)
        sent = False
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            prefix = "" if rel_dir == "." else rel_dir + "/"
            if prefix:
                yield self._proto.ShardChunk(path=prefix, **head)
                head, sent = {}, True
            for name in sorted(filenames):
                with open(os.path.join(dirpath, name), "rb") as f:
                    first = True
                    while True:
                        data = f.read(self._proto.CHUNK_BYTES)
                        if not data and not first:
                            break
                        yield self._proto.ShardChunk(path=prefix + name, data=data, **head)
                        head, sent, first = {}, True, False
                        if len(data) < self._proto.CHUNK_BYTES:
                            break
        if not sent:
            yield self._proto.ShardChunk(**head)

    def ship_shard(self, ctx: TrainContext, root: str) -> str:
        """Sends the shard in ``root`` to the driver; returns the upload's name."""
        try:
            return self._put(self._chunks(ctx, root), wait_for_ready=True).upload
        except self._grpc.RpcError as e:
            raise ReportError(f"checkpoint upload refused ({e.code().name}): {e.details()}") from None

    def fetch_shard(self, ctx: TrainContext, whole: bool = False) -> Optional[str]:
        """Fetches this rank's shard of the checkpoint its run resumes from
        into a temporary directory (None when it holds none for this rank);
        with ``whole``, every rank's, each in its ``rank-<r>/``."""
        import atexit
        import shutil
        import tempfile

        request = self._proto.ShardRequest(version=self._proto.PROTOCOL_VERSION, trial_id=ctx.trial_id, token=self._token,
                                           rank=ctx.world_rank, whole=whole)
        kind = "whole" if whole else f"rank-{ctx.world_rank}"
        dest = tempfile.mkdtemp(prefix=f"nestor-{ctx.trial_id}-{kind}-")
        atexit.register(shutil.rmtree, dest, True)
        current, out, seen = None, None, set()
        try:
            for chunk in self._get(request, wait_for_ready=True):
                if not chunk.path:
                    continue
                parts = chunk.path.rstrip("/").split("/")
                if any(p in ("", ".", "..") for p in parts) or chunk.path.startswith("/"):
                    raise ReportError(f"the driver sent a bad shard file name {chunk.path!r}")
                target = os.path.join(dest, *parts)
                if chunk.path.endswith("/"):
                    os.makedirs(target, exist_ok=True)
                    continue
                if chunk.path != current:
                    if out is not None:
                        out.close()
                    if chunk.path in seen:
                        raise ReportError(f"the driver sent shard file {chunk.path!r} twice")
                    seen.add(chunk.path)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    out, current = open(target, "xb"), chunk.path
                out.write(chunk.data)
        except self._grpc.RpcError as e:
            shutil.rmtree(dest, True)
            if e.code() == self._grpc.StatusCode.NOT_FOUND:
                return None
            raise ReportError(f"cannot fetch the checkpoint to resume from ({e.code().name}): {e.details()}") from None
        finally:
            if out is not None:
                out.close()
        return dest

    def fetch_file(self, ctx: TrainContext, path: str) -> str:
        """Fetches ``path`` (one of ``[trainer] files``) from the driver into
        a temporary file of this node, removed at exit; returns its path."""
        import atexit
        import tempfile

        request = self._proto.ShardRequest(version=self._proto.PROTOCOL_VERSION, trial_id=ctx.trial_id, token=self._token,
                                           rank=ctx.world_rank, path=path)
        fd, dest = tempfile.mkstemp(prefix=f"nestor-{ctx.trial_id}-rank-{ctx.world_rank}-", suffix="-" + os.path.basename(path))
        atexit.register(os.unlink, dest)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in self._get_file(request, wait_for_ready=True):
                    out.write(chunk.data)
        except self._grpc.RpcError as e:
            raise ReportError(f"cannot fetch {path} from the driver ({e.code().name}): {e.details()}") from None
        return dest

    def report(self, ctx: TrainContext, metrics: Dict[str, float], checkpoint: str, extra: Optional[Dict[str, Any]] = None) -> int:
        plan = _plan()
        #: The checkpoint's route out, as the report's ``checkpoint`` oneof names it (none without one).
        sent: Dict[str, str] = {}
        target = plan.upload()
        if checkpoint and target and not _upload_failed:
            uploaded = _upload(checkpoint, target, ctx, self._reports)
            if uploaded:
                checkpoint, sent = "", {"checkpoint_uploaded": uploaded}
        out = plan.out_after_upload()
        if checkpoint and out.get("kind") == "ship":
            sent = {"checkpoint_upload": self.ship_shard(ctx, checkpoint)}
        elif checkpoint and out.get("kind") == "stage":
            sent = {"checkpoint_staged_dir": _stage(checkpoint, out["dir"], ctx.world_rank)}
        elif checkpoint:
            sent = {"checkpoint_dir": checkpoint}
        request = self._proto.ReportRequest(
            version=self._proto.PROTOCOL_VERSION,
            trial_id=ctx.trial_id,
            token=self._token,
            rank=ctx.world_rank,
            metrics=metrics,
            **sent,
            extra=json.dumps(extra) if extra else "",
        )
        try:
            reply = self._call(request, wait_for_ready=True)
        except self._grpc.RpcError as e:
            raise ReportError(f"report refused ({e.code().name}): {e.details()}") from None
        self._reports += 1
        #: The iteration the driver gave the last report (its checkpoint's ``checkpoint_NNNNNN``).
        self.last_iteration = int(reply.training_iteration)
        return reply.directive


_upload_failed = False


def _upload(src: str, target: Dict[str, Any], ctx: TrainContext, reports: int) -> str:
    """Uploads ``src`` as this rank's shard of this report's checkpoint with
    ``nestor put-shard`` (the store's credentials from the environment);
    returns the checkpoint's URI, or "" (once, with a note) when this node
    cannot: its checkpoints then go through the driver."""
    global _upload_failed
    import subprocess

    iteration = ctx.start_iteration + reports + 1
    try:
        uploader = target.get("uploader")
        if not uploader:
            from . import _binary

            uploader = _binary.find()
        args = [uploader, "put-shard", src, target["store"], "--iteration", str(iteration), "--rank", str(ctx.world_rank)]
        out = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        out = None
        why = str(e)
    if out is not None and out.returncode == 0:
        return out.stdout.strip()
    why = out.stderr.strip() if out is not None else why
    print(f"nestor: rank {ctx.world_rank} cannot upload to {target['store']} ({why}); "
          "its checkpoints go through the driver", file=sys.stderr)
    _upload_failed = True
    return ""


def _stage(src: str, staging: str, rank: int) -> str:
    """Copies the checkpoint directory ``src`` (every file synced) to a new
    ``rank-<rank>-...`` directory below the trial's staging directory, where
    the driver takes it from: the rank persists its own bytes, so a directory
    only this node sees (a ``tempfile`` on a node's own /tmp) works."""
    import shutil
    import uuid

    dest = os.path.join(staging, f"rank-{rank}-{uuid.uuid4().hex[:16]}")
    try:
        shutil.copytree(src, dest)
        for dirpath, _dirs, files in os.walk(dest):
            for name in files:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fd = os.open(dirpath, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as e:
        shutil.rmtree(dest, ignore_errors=True)
        raise ReportError(f"cannot copy checkpoint {src} to {staging}: {e}") from None
    return dest


_channel: Optional[_Channel] = None


def _get_channel() -> "_Channel":
    global _channel
    if _channel is None:
        _channel = _Channel()
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


#: The resources ``init`` declared (``[resources]`` of the sweeps this process runs).
_declared_resources: Dict[str, float] = {}

#: ``init(cluster=SlurmJobs(...))``: the experiment's ``[cluster]`` table, or None.
_cluster: Optional[Dict[str, Any]] = None


@dataclass
class SlurmJobs:
    """Each trial run a Slurm job of its own, submitted from where this
    driver runs (a login node): the experiment file's ``[cluster] backend =
    "slurm_jobs"`` and ``[cluster.jobs]``, given to :func:`init`. The
    experiment's directory (``RunConfig(storage_path=...)``) must be on a
    file system the nodes share."""

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    #: Each job's time limit, in Slurm's form ("90", "4:00:00", "1-12:00:00").
    time: Optional[str] = None
    #: More sbatch options, one word each ("--constraint=a100").
    sbatch: List[str] = field(default_factory=list)
    #: The most jobs queued or running at once.
    max_jobs: int = 16
    #: Seconds before a job's time limit that its ranks are told (get_preemption_info); 0: never.
    signal_s: int = 120
    #: Seconds between two readings of the jobs' states (one squeue call for all).
    poll_s: float = 10.0
    #: The address the nodes reach this machine at (default: its host name).
    report_address: Optional[str] = None

    def _table(self) -> Dict[str, Any]:
        jobs: Dict[str, Any] = {"max_jobs": int(self.max_jobs), "signal_s": int(self.signal_s), "poll_s": float(self.poll_s)}
        for k in ("partition", "account", "qos", "time"):
            if getattr(self, k) is not None:
                jobs[k] = str(getattr(self, k))
        if self.sbatch:
            jobs["sbatch"] = [str(o) for o in self.sbatch]
        table: Dict[str, Any] = {"backend": "slurm_jobs", "jobs": jobs}
        if self.report_address:
            table["report_address"] = self.report_address
        return table

#: ``ray.init`` arguments that only concern Ray's own processes.
_INIT_QUIET = {"ignore_reinit_error", "include_dashboard", "logging_level", "configure_logging",
               "runtime_env", "namespace", "dashboard_host", "dashboard_port", "local_mode", "_temp_dir"}


#: ``init(log_to_driver=False)``: the ranks' output stays in their logs, off the console.
_log_to_driver = True


def init(address: Optional[str] = None, *, num_cpus: Optional[float] = None, num_gpus: Optional[float] = None,
         resources: Optional[Mapping[str, float]] = None, cluster: Optional[SlurmJobs] = None, log_to_driver: bool = True,
         **kwargs: Any) -> None:
    """Ray's ``ray.init``: nestor has no cluster to start or join. ``num_cpus``,
    ``num_gpus`` and ``resources`` are the pool the sweeps of this process
    schedule on (the experiment's ``[resources]``), as in Ray;
    ``cluster=SlurmJobs(...)`` runs each trial run as a Slurm job of its
    own; ``log_to_driver=False`` keeps the ranks' output off this console
    (it is in their logs either way); other arguments are ignored with a note."""
    global _cluster, _log_to_driver
    _log_to_driver = bool(log_to_driver)
    if cluster is not None:
        if not isinstance(cluster, SlurmJobs):
            raise ValueError(f"init(cluster={cluster!r}): give nestor.SlurmJobs(...)")
        _cluster = cluster._table()
    for name, value in (("CPU", num_cpus), ("GPU", num_gpus)):
        if value is not None:
            if not isinstance(value, numbers.Real) or value < 0:
                raise ValueError(f"init(num_{name.lower()}s={value!r}): give a number >= 0")
            _declared_resources[name] = float(value)
    for name, value in (resources or {}).items():
        if not isinstance(value, numbers.Real) or value < 0:
            raise ValueError(f"init(resources={{{name!r}: {value!r}}}): give a number >= 0")
        _declared_resources[str(name)] = float(value)
    ignored = sorted(k for k in kwargs if k not in _INIT_QUIET)
    if address not in (None, "auto", "local"):
        ignored.insert(0, "address")
    if ignored:
        print(f"nestor: init({', '.join(ignored)}) ignored: nestor needs no cluster (inside a Slurm allocation "
              "it uses the allocation)", file=sys.stderr)


def shutdown() -> None:
    """Ray's ``ray.shutdown``: forgets what ``init`` declared."""
    global _cluster, _log_to_driver
    _declared_resources.clear()
    _cluster = None
    _log_to_driver = True


def is_initialized() -> bool:
    """Always True: nestor is ready without ``init``."""
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
