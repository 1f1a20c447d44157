"""One rank of a function trainable: ``python -m nestor._worker BLOB`` loads
the training function the driver pickled, calls it with the trial's config
and exits 0 (the function returned, or the trial was stopped) or 1 with the
traceback and this rank's node as the last lines of its log."""

import inspect
import os
import pickle
import socket
import sys
import traceback
from typing import Any, Dict


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
    try:
        out = call(blob["fn"], config)
        if isinstance(out, dict) and out:
            # Ray's function trainables may return their final metrics.
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


def _shutdown_torch() -> None:
    """Leaves the process group the trial joined (Ray Train does the same at a run's end)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m nestor._worker BLOB", file=sys.stderr)
        sys.exit(2)
    try:
        blob = load(sys.argv[1])
    except Exception:
        print(f"nestor: cannot load the training function from {sys.argv[1]}:\n{traceback.format_exc().rstrip()}", file=sys.stderr)
        sys.exit(1)
    code = run(blob)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
