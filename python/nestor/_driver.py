"""The Python driver: turns a trainable and its configs into the experiment
file the binary runs, ships the training function by value, runs ``nestor
run`` (or ``nestor resume``) and reads the results back. The binary owns the
loop; nothing here schedules or samples."""

import datetime
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Dict, List, Optional

from . import _binary, _contract, _toml, _worker
from ._worker import BLOB_VERSION


class TuneError(RuntimeError):
    """The sweep could not run: the binary's own message (a bad setting names its key)."""


class FailFast(TuneError):
    """``FailureConfig(fail_fast=...)`` stopped the sweep at its first failed
    trial; every result before it is stored."""


def experiment_dirs(storage: Optional[str], name: str) -> str:
    """The experiment's local directory: ``<storage>/<name>``, or
    ``./nestor-runs/<name>`` when storage is a URL or not given."""
    if storage and "://" not in storage:
        return os.path.abspath(os.path.join(os.path.expanduser(storage), name))
    return os.path.abspath(os.path.join("nestor-runs", name))


def is_url(path: str) -> bool:
    """Whether ``path`` names an experiment in an object store (``s3://``, ``gs://``, ``az://``)."""
    return "://" in path and not path.startswith("file://")


def pull(url: str, check: bool = True) -> Optional[str]:
    """``nestor pull URL``: the experiment in an object store brought back
    into its local directory (its files and its result store); that
    directory, or None (``check=False``) when there is no experiment there."""
    import subprocess

    from . import _binary

    out = subprocess.run([_binary.find(), "pull", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        if not check:
            return None
        raise ValueError(f"Tuner.restore({url!r}): {out.stderr.strip() or 'nestor pull failed'}")
    return out.stdout.strip().splitlines()[-1]


def default_name(trainable: Any, storage: Optional[str] = None) -> str:
    """Ray's default experiment name, ``<trainable>_<date>_<time>``; a
    second sweep of the same trainable started in the same second (Ray's doc
    scripts do that) gets ``_2``, ``_3``, ...: its directory is claimed here,
    so two drivers at once never share one."""
    stem = getattr(trainable, "__name__", None) or type(trainable).__name__
    base = f"{stem}_{datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}"
    for n in range(1, 10_000):
        name = base if n == 1 else f"{base}_{n}"
        exp_dir = experiment_dirs(storage, name)
        os.makedirs(os.path.dirname(exp_dir), exist_ok=True)
        try:
            # Its owner's alone (what goes in it: the pickled function, logs, checkpoints).
            os.mkdir(exp_dir, 0o700)
        except FileExistsError:
            continue
        return name
    raise TuneError(f"no free experiment name {base}_N below {os.path.dirname(experiment_dirs(storage, base))}")


def write_blob(exp_dir: str, payload: Dict[str, Any]) -> str:
    """Pickles the trainable by value (cloudpickle: functions of ``__main__``
    with the globals they use; importable modules by reference) into the
    experiment's ``driver/`` directory; returns its path."""
    import cloudpickle

    os.makedirs(os.path.join(exp_dir, "driver"), exist_ok=True)
    path = os.path.join(exp_dir, "driver", "trainable.pkl")
    try:
        data = cloudpickle.dumps({"version": BLOB_VERSION, **payload})
    except Exception as e:  # what cloudpickle cannot pickle, named
        raise TypeError(
            f"the training function cannot be sent to the workers: {type(e).__name__}: {e}. It and the globals it uses "
            "must be picklable; create locks, open files and clients inside the function, or pass data with "
            "tune.with_parameters"
        ) from None
    tmp = path + ".tmp"
    with _private(tmp) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _private(path: str):
    """``path`` opened for writing (truncated), readable by its owner alone: a
    pickled function carries the globals it captured."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")


def write_run_settings(exp_dir: str, settings: Dict[str, Any]) -> None:
    """Keeps what the workers need of the run config beside the blob, so a
    ``Tuner.restore`` (given only the trainable) runs them the same way."""
    import json

    os.makedirs(os.path.join(exp_dir, "driver"), exist_ok=True)
    with open(os.path.join(exp_dir, "driver", "run.json"), "w") as f:
        json.dump(settings, f)


def read_run_settings(exp_dir: str) -> Dict[str, Any]:
    import json

    try:
        with open(os.path.join(exp_dir, "driver", "run.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def worker_env() -> Dict[str, str]:
    """PYTHONPATH for the workers: the script's directory and the working
    directory (so modules the function imports by name load there too), and
    this nestor package's parent when it is not installed in site-packages."""
    paths: List[str] = []
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    package = os.path.dirname(os.path.abspath(__file__))
    # Not nestor's own directory (a run started inside a trial, whose main is nestor._worker).
    if main_file and os.path.dirname(os.path.abspath(main_file)) != package:
        paths.append(os.path.dirname(os.path.abspath(main_file)))
    paths.append(os.getcwd())
    paths.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.environ.get("PYTHONPATH"):
        paths.extend(os.environ["PYTHONPATH"].split(os.pathsep))
    seen: List[str] = []
    for p in paths:
        if p and p not in seen:
            seen.append(p)
    return {"PYTHONPATH": os.pathsep.join(seen)}


#: A trial's variables that a run inside it keeps (settings of the user's, not of the trial).
_KEPT = {"NESTOR_BIN", "NESTOR_WARM", "NESTOR_CALLBACK_DEADLINE_S", "NESTOR_PY_CACHE", "NESTOR_CONNECT_TIMEOUT_S"}
_TORCHRUN = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
             "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"}


def _trial_variable(name: str) -> bool:
    return (name.startswith("NESTOR_") and name not in _KEPT) or name in _TORCHRUN


def run_binary(args: List[str], hooks: Optional[Any] = None, warm: Optional[str] = None) -> None:
    """Runs ``nestor ARGS`` with the terminal's stdout, relaying its stderr;
    Ctrl-C here reaches it once per press (once: a graceful stop; twice:
    kill), as with ``nestor run``. ``hooks`` (a ``_hooks.HookServer``) serves
    the sweep's Python code meanwhile. ``warm`` is the pickled function the
    sweep's warm process serves: this process, which imported what it
    imports, is forked as that process where it may be
    (``_worker.offer``). Raises on its failure codes."""
    env = None
    if _contract.inside():
        # A run started inside a trial (Train V2's Tune pattern): its workers
        # get their own variables, none of the trial's.
        env = {k: v for k, v in os.environ.items() if not _trial_variable(k)}
    if hooks is not None:
        env = {**(env if env is not None else os.environ), **hooks.env()}
    # The binary stops (gracefully: SIGTERM) when this process dies; it
    # sets that itself (NESTOR_PARENT_PID): no Python code runs between
    # fork and exec, which a process with gRPC's threads (a trial's) may not.
    # Its own session: Ctrl-C here reaches it once per press, forwarded.
    env = {**(env if env is not None else os.environ), "NESTOR_PARENT_PID": str(os.getpid())}
    offered = None
    if warm is not None and os.environ.get("NESTOR_WARM", "1") != "0":
        # Forked before this process starts a thread (the relay's, the hooks').
        offered = _worker.offer(warm, close=hooks.all_fds() if hooks is not None else ())
    try:
        if offered is not None:
            env = {**env, **offered.env()}
        fds = [*(hooks.child_fds() if hooks is not None else ()), *(offered.fds if offered is not None else ())]
        proc = subprocess.Popen([_binary.find(), *args], stderr=subprocess.PIPE, start_new_session=True, env=env, pass_fds=fds)
    except BaseException:
        if offered is not None:
            offered.reap(timeout=0)
        raise
    if offered is not None:
        offered.handed()
    if hooks is not None:
        hooks.start()
    last: List[str] = []

    def relay() -> None:
        assert proc.stderr is not None
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace")
            sys.stderr.write(line)
            sys.stderr.flush()
            if line.startswith("error: "):
                last.append(line[len("error: "):].rstrip("\n"))

    t = threading.Thread(target=relay, daemon=True)
    t.start()
    forward = lambda sig, _frame: proc.send_signal(sig)  # noqa: E731
    in_main = threading.current_thread() is threading.main_thread()
    old = {}
    if in_main:
        for s in (signal.SIGINT, signal.SIGTERM):
            old[s] = signal.signal(s, forward)
    try:
        code = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        t.join(timeout=5)
        if offered is not None:
            offered.reap()
        if hooks is not None:
            hooks.finish()
    message = last[-1] if last else f"nestor {args[0]} exited with code {code}"
    if code == 0:
        return
    if code == 130:
        raise KeyboardInterrupt(message)
    if code == 2:
        raise ValueError(message)
    if code == 3:
        raise FailFast(message)
    raise TuneError(message)


def write_hooks(exp_dir: str, hooks: Dict[str, Any]) -> None:
    """Pickles the sweep's Python hooks (callbacks, stop, explore) by value, for ``Tuner.restore``."""
    import cloudpickle

    path = os.path.join(exp_dir, "driver", "hooks.pkl")
    try:
        data = cloudpickle.dumps({"version": BLOB_VERSION, **hooks})
    except Exception as e:
        raise TypeError(f"the sweep's callbacks and stop function cannot be saved for Tuner.restore: {type(e).__name__}: {e}") from None
    with _private(path + ".tmp") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def read_hooks(exp_dir: str) -> Optional[Dict[str, Any]]:
    """The hooks ``write_hooks`` saved, or None when the sweep has none."""
    import pickle

    path = os.path.join(exp_dir, "driver", "hooks.pkl")
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception as e:
        raise ValueError(f"Tuner.restore: the sweep's callbacks and stop function in {path} cannot be loaded "
                         f"({type(e).__name__}: {e}); restore it from the script that ran it") from None


def write_experiment(exp_dir: str, doc: Dict[str, Any]) -> str:
    path = os.path.join(exp_dir, "driver", "sweep.toml")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(_toml.dumps(doc))
    return path
