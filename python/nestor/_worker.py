"""One rank of a function trainable: ``python -m nestor._worker BLOB`` loads
the training function the driver pickled, calls it with the trial's config
and exits 0 (the function returned, or the trial was stopped) or 1 with the
traceback and this rank's node as the last lines of its log.

With ``NESTOR_ZYGOTE=1`` (``[trainer] warm = true``) the same command is the
warm process: it loads the function once (importing what it imports), then
forks each rank the driver asks for (``nestor._zygote``, which says how).
"""

import inspect
import os
import pickle
import signal
import socket
import sys
import traceback
from typing import Any, Dict, List, Optional, Sequence

from . import _contract

#: The blob's format (the driver's pickled function); others are refused.
BLOB_VERSION = 1


def load(path: str) -> Dict[str, Any]:
    """The driver's blob: the function and how to call it."""
    with open(path, "rb") as f:
        blob = pickle.load(f)
    if not isinstance(blob, dict) or blob.get("version") != BLOB_VERSION:
        raise RuntimeError(f"{path} was written by another nestor version (expected blob version {BLOB_VERSION})")
    return blob


def trial_config(blob: Dict[str, Any], config: Dict[str, Any]) -> Dict[str, Any]:
    """What the function is called with: for a trainer, its
    ``train_loop_config`` updated by the trial's ``train_loop_config``; for a
    plain function, the trial's config."""
    if blob.get("kind") == "trainer":
        merged = dict(blob.get("train_loop_config") or {})
        merged.update(config.get("train_loop_config") or {})
        # Ray's older XGBoost/LightGBM trainers take their booster's settings
        # from the trial's config too: {"params": {...}} merged into theirs,
        # "num_boost_round" in place of theirs.
        overrides = {k: config[k] for k in ("params", "num_boost_round") if k in config}
        if overrides and ("__xgboost__" in merged or "__lightgbm__" in merged):
            merged["__overrides__"] = overrides
        return merged
    return config


def call(fn: Any, config: Dict[str, Any]) -> Any:
    try:
        takes = len(inspect.signature(fn).parameters) > 0
    except (TypeError, ValueError):
        takes = True
    return fn(config) if takes else fn()


def run(blob: Dict[str, Any]) -> int:
    """Runs the function on this rank; returns the exit code."""
    import nestor

    ctx = nestor.get_context()
    config = trial_config(blob, ctx.config)
    nestor._datasets = blob.get("datasets") or {}
    nestor._metadata = dict(blob.get("metadata") or {})
    _enter_trial_dir(ctx.trial_dir)
    resume = blob.get("resume_from_checkpoint")
    plan = _contract.plan()
    if resume and (plan is None or not plan.back.get("kind") or plan.back.get("kind") == "none"):
        # A trainer's resume_from_checkpoint: its first run starts from it (this rank's shard, else rank 0's).
        for d in (os.path.join(resume, f"rank-{ctx.world_rank}"), os.path.join(resume, "rank-0"), resume):
            if os.path.isdir(d):
                nestor._resume_from = d
                break
    try:
        if blob.get("kind") == "class":
            from . import _trainable as trainable

            trainable.run(blob["cls"], blob.get("kwargs") or {}, blob.get("stop") or {}, bool(blob.get("checkpoint_at_end")))
            return 0
        backend_config = blob.get("backend_config")
        if backend_config is None and blob.get("backend") == "torch":
            # A TorchTrainer pickled before trainers carried their backend config (an older experiment resumed).
            from . import torch as nestor_torch

            nestor_torch.init_process_group(always=True)
        if backend_config is not None:
            # A framework's hooks around the function, in every rank (nestor.train.backend).
            from .train.backend import _run_hooks

            out = _run_hooks(backend_config, ctx, lambda: call(blob["fn"], config))
        else:
            out = call(blob["fn"], config)
        if isinstance(out, dict) and out and blob.get("kind") != "trainer":
            # A Tune function trainable may return its final metrics; a Ray
            # Train training function's return value is ignored, as in Ray.
            nestor.report(out)
    except SystemExit as e:
        return 0 if e.code in (None, 0) else (e.code if isinstance(e.code, int) else 1)
    except BaseException:
        sys.stdout.flush()
        where = f"rank {ctx.world_rank} of trial {ctx.trial_id} on node {socket.gethostname()}"
        print(f"nestor: the training function raised on {where}:\n{traceback.format_exc().rstrip()}", file=sys.stderr, flush=True)
        return 1
    finally:
        _shutdown_torch()
    return 0


def _enter_trial_dir(trial_dir: str) -> None:
    """Makes the trial's directory the rank's working directory, as Ray Tune
    does, so relative paths (a Hugging Face ``output_dir``, a Lightning
    ``default_root_dir``) are the trial's own, not shared by the trials that
    run at once; the ranks of a trial on one node share it. The directory
    the script ran in stays importable and is in ``TUNE_ORIG_WORKING_DIR``.
    ``RAY_CHDIR_TO_TRIAL_DIR=0`` (Ray's switch) keeps the script's."""
    if os.environ.get("RAY_CHDIR_TO_TRIAL_DIR", "1") == "0" or not trial_dir:
        return
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    os.environ.setdefault("TUNE_ORIG_WORKING_DIR", here)
    try:
        os.makedirs(trial_dir, exist_ok=True)
        os.chdir(trial_dir)
    except OSError:
        pass  # a node that cannot make it runs where it started


def _shutdown_torch() -> None:
    """Leaves the process group the trial joined (Ray Train does the same at a run's end)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def serve(blob: Dict[str, Any]) -> None:
    """The warm process: what every rank needs loaded once, then a fork
    per rank (``nestor._zygote``); a request that names another blob (a
    trainer inside a trial) has it loaded here first, its framework too."""
    # What every rank needs, loaded once.
    import grpc  # noqa: F401

    from . import _proto  # noqa: F401
    from ._zygote import serve as fork_ranks

    def framework(b: Dict[str, Any]) -> None:
        if b.get("backend") == "torch" and "nestor.torch" not in sys.modules:
            try:
                from . import torch as _torch  # noqa: F401  (torch and its process group helpers)
            except ImportError:
                pass  # each rank says so

    def load_for(req: Dict[str, Any]) -> Dict[str, Any]:
        if not req.get("blob"):
            return blob
        try:
            other = load(req["blob"])
        except Exception:
            raise RuntimeError(f"cannot load {req['blob']}: {traceback.format_exc().rstrip()}") from None
        framework(other)
        return other

    framework(blob)
    fork_ranks(lambda _req, loaded: run(loaded), load_for)


class Offered:
    """A warm process this driver forked for the binary (``NESTOR_WARM_FDS``)."""

    def __init__(self, pid: int, fds: List[int], blob: str):
        self.pid, self.fds, self.blob = pid, fds, blob

    def env(self) -> Dict[str, str]:
        return {"NESTOR_WARM_FDS": ",".join(str(fd) for fd in [*self.fds, self.pid]), "NESTOR_WARM_FOR": self.blob}

    def handed(self) -> None:
        """After the binary started: this process's copies of its ends closed
        (so the warm process hears the binary's end as its requests' end)."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []

    def reap(self, timeout: float = 5.0) -> None:
        """After the binary ended: the warm process ends with its requests'
        pipe; waited for (killed with its ranks past ``timeout``)."""
        import time

        self.handed()
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid:
                return
            if time.monotonic() > deadline:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except OSError:
                    pass
                os.waitpid(self.pid, 0)
                return
            time.sleep(0.01)


def unforkable() -> Optional[str]:
    """Why this process may not be forked as a warm process, or None: it
    must run nothing a fork would copy half-way (a thread of its own, a
    thread pool that has worked: OpenMP's, gRPC's), hold no CUDA context,
    and be a driver (not a trial's rank)."""
    import threading

    if os.environ.get("NESTOR_WARM_FORK", "1") == "0":
        return "NESTOR_WARM_FORK=0"
    if not os.path.isdir("/proc/self/task"):
        return "no /proc to count this process's threads"
    if _contract.inside():
        return "a run inside a trial"
    if threading.active_count() > 1:
        return "a Python thread runs"
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return "CUDA is initialised"
    except Exception:
        return "torch.cuda cannot say whether CUDA is initialised"
    threads = len(os.listdir("/proc/self/task"))
    expected = 1 + _openblas_threads()
    if threads != expected:
        # A pool that has worked (OpenMP's after a torch operation: its
        # threads would not exist in a fork, whose first parallel region
        # would wait for them for ever), gRPC's, a library's.
        return f"{threads} threads run ({expected} expected of what was imported)"
    return None


def _openblas_threads() -> int:
    """The threads OpenBLAS started when it loaded (its server threads:
    one fewer than its thread count), summed over the copies this process
    loaded (numpy's, scipy's). They are safe to fork: OpenBLAS stops and
    restarts them around a fork."""
    import ctypes

    paths = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                if "openblas" in os.path.basename(path).lower() and path.startswith("/"):
                    paths.add(path)
    except OSError:
        return 0
    extra = 0
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("openblas_get_num_threads", "openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                     "scipy_openblas_get_num_threads64_"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                extra += max(0, int(fn()) - 1)
                break
    return extra


def offer(blob_path: str, close: Sequence[int] = ()) -> Optional[Offered]:
    """Forks this driver as the sweep's warm process, when it is safe to
    (``unforkable``): the training function's modules are imported here
    already, so the ranks start without importing them again. The child
    serves ``blob_path`` as ``python -m nestor._worker`` would, on three
    pipes the binary inherits; ``close`` are descriptors of this process
    that must not stay open in it (pipes whose end another process waits for)."""
    why = unforkable()
    if why is not None:
        if os.environ.get("NESTOR_DEBUG_WARM"):
            print(f"nestor: the warm process is started by the binary: {why}", file=sys.stderr)
        return None
    import warnings

    req_r, req_w = os.pipe()
    ans_r, ans_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # OpenBLAS's threads, counted above
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            os.dup2(req_r, 0)
            os.dup2(ans_w, 1)
            os.dup2(err_w, 2)
            for fd in (req_r, req_w, ans_r, ans_w, err_r, err_w, *close):
                try:
                    os.close(fd)
                except OSError:
                    pass
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGHUP):
                signal.signal(s, signal.SIG_DFL)
            _forget_driver()
            from ._zygote import python_path

            python_path()  # the PYTHONPATH the driver set for its workers, as an interpreter started now would have it
            serve(load(blob_path))
            code = 0
        except BaseException:
            try:
                traceback.print_exc()
            except BaseException:
                pass
        finally:
            try:
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(req_r)
    os.close(ans_w)
    os.close(err_w)
    return Offered(pid, [req_w, ans_r, err_r], blob_path)


def _forget_driver() -> None:
    """In the forked warm process: nestor's per-process state back to a
    fresh process's (the driver may have run the function locally, or
    declared a cluster), so each rank finds its own."""
    import nestor

    nestor._context = None
    nestor._fetched = None
    nestor._resume_from = None
    nestor._channel = None
    nestor._datasets = {}
    nestor._metadata = {}
    nestor._stopped = False
    for name, attr, value in (("nestor._client", "_preempted_at", None), ("nestor._client", "_upload_failed", False),
                              ("nestor.train", "_whole", None)):
        module = sys.modules.get(name)
        if module is not None:
            setattr(module, attr, value)
    settings = sys.modules.get("nestor._settings")
    if settings is not None:
        settings.shutdown()


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m nestor._worker BLOB", file=sys.stderr)
        sys.exit(2)
    path = sys.argv[1]
    try:
        if not os.path.exists(path) and _contract.inside():
            # A node that does not see the experiment's directory: the driver sends it.
            import nestor

            path = nestor._get_channel().fetch_file(nestor.get_context(), path)
        blob = load(path)
    except Exception:
        print(f"nestor: cannot load the training function from {sys.argv[1]}:\n{traceback.format_exc().rstrip()}", file=sys.stderr)
        sys.exit(1)
    if os.environ.get("NESTOR_ZYGOTE") == "1":
        serve(blob)
        return
    code = run(blob)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
