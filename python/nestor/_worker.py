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
import socket
import sys
import traceback
from typing import Any, Dict

from . import _contract


def load(path: str) -> Dict[str, Any]:
    """The driver's blob: the function and how to call it."""
    with open(path, "rb") as f:
        blob = pickle.load(f)
    from ._driver import BLOB_VERSION

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
