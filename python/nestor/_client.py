"""The worker's client of the driver: the gRPC channel (reports, shards
shipped and fetched, the rendezvous, a trainer's booking), a checkpoint's
way out (uploaded by the rank with ``nestor put-shard``, or staged below the
trial's directory), and the cluster's preemption notice. ``nestor``
re-exports what is public (``ReportError``, ``PreemptionInfo``); its
``report`` and ``get_checkpoint`` drive this."""

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

from . import _contract


class ReportError(RuntimeError):
    """The driver refused a report (bad input, wrong token) or cannot be reached."""


ReportError.__module__ = "nestor"


def run_plan() -> "Optional[_contract.Plan]":
    """This rank's run plan (``NESTOR_RUN``), or None outside nestor."""
    try:
        return _contract.plan()
    except _contract.PlanError as e:
        raise ReportError(str(e)) from None


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



PreemptionInfo.__module__ = "nestor"


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
    plan = run_plan()
    if not plan or not plan.preemption or plan.preemption.get("signal") != "USR1":
        return
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, _on_preemption_signal)


def preempted_at() -> Optional[float]:
    """When the cluster's notice came (``time.time()``), or None."""
    return _preempted_at


def _open_channel(grpc, addr, target):
    """The channel to the driver: TLS when its address is ``https://``
    (ranks on other machines), trusting only the certificate authority the
    driver made for itself (the plan's ``tls_ca``) and checking the name its
    certificate is made out to, whatever host the address names."""
    if not addr.startswith("https://"):
        return grpc.insecure_channel(target)
    ca = run_plan().tls_ca
    if not ca.strip():
        raise ReportError(f"the driver's address {addr!r} is TLS, but the run's plan names no certificate authority (tls_ca)")
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.encode())
    return grpc.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", "nestor-report")])


class Channel:
    def __init__(self):
        import grpc

        from . import _proto

        addr = run_plan().addr
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

    def book(self, ctx: Any, scaling: Dict[str, Any]) -> List[Dict[str, Any]]:
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

    def run_trainer(self, ctx: Any, run: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
        """Asks the driver to run the trainer this trial booked (``run``: its
        name, directory, ``[trainer]`` section, config, failure and
        checkpoint settings) as this trial's own run; yields what becomes of
        it, one update at a time (``{"result": ...}``, ``{"restarted": ...}``,
        then ``{"ended": ...}``). Closing the iterator stops the run. A run
        the driver refuses raises ValueError naming the key at fault."""
        import json

        request = self._proto.TrainerRequest(version=self._proto.PROTOCOL_VERSION, trial_id=ctx.trial_id, token=self._token,
                                             rank=ctx.world_rank, run=json.dumps(run))
        call = self._channel.unary_stream(
            self._proto.RUN_TRAINER_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self._proto.TrainerUpdate.FromString,
        )
        stream = call(request, wait_for_ready=True)
        try:
            for update in stream:
                yield json.loads(update.update)
        except self._grpc.RpcError as e:
            if e.code() == self._grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(e.details()) from None
            raise ReportError(f"the trainer's run failed ({e.code().name}): {e.details()}") from None
        finally:
            stream.cancel()

    def rendezvous(self, ctx: Any, address: str, timeout: float) -> str:
        """Rank 0 posts ``address`` (its store's ``host:port``); the other
        ranks get it once posted."""
        request = self._proto.RendezvousRequest(
            version=self._proto.PROTOCOL_VERSION, trial_id=ctx.trial_id, token=self._token, rank=ctx.world_rank, address=address
        )
        try:
            return self._meet(request, timeout=timeout, wait_for_ready=True).address
        except self._grpc.RpcError as e:
            raise ReportError(f"rendezvous through the driver failed ({e.code().name}): {e.details()}") from None

    def _chunks(self, ctx: Any, root: str):
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

    def ship_shard(self, ctx: Any, root: str) -> str:
        """Sends the shard in ``root`` to the driver; returns the upload's name."""
        try:
            return self._put(self._chunks(ctx, root), wait_for_ready=True).upload
        except self._grpc.RpcError as e:
            raise ReportError(f"checkpoint upload refused ({e.code().name}): {e.details()}") from None

    def fetch_shard(self, ctx: Any, whole: bool = False) -> Optional[str]:
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

    def fetch_file(self, ctx: Any, path: str) -> str:
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

    def report(self, ctx: Any, metrics: Dict[str, float], checkpoint: str, extra: Optional[Dict[str, Any]] = None) -> int:
        plan = run_plan()
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


def _upload(src: str, target: Dict[str, Any], ctx: Any, reports: int) -> str:
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



_watch_preemption()
