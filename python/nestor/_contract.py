"""The run's plan: everything nestor tells a rank, as one document.

The driver gives every rank ``NESTOR_RUN`` (JSON, built once by the run's
engine; see ``trainer/src/contract.rs``) and the run's token apart from it in
``NESTOR_TOKEN``. A rank's place stays torchrun's variables (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ...). Ranks started by an older nestor (a
job script of an experiment from before the plan) get one variable a
setting instead: read here too, as a version 1 plan. Both readers, this and
the Rust ``RunPlan::from_env``, are pinned to the same routes by the
fixtures in ``tests/contract/``.
"""

import json
import os
from typing import Any, Dict, Mapping, Optional

PLAN_VAR = "NESTOR_RUN"
TOKEN_VAR = "NESTOR_TOKEN"
#: The newest plan this reader knows.
PLAN_VERSION = 2


class PlanError(RuntimeError):
    """The plan cannot be read (not JSON, or newer than this nestor)."""


class Plan:
    """A run's plan, read-only: ``trial``, ``world``, ``channel`` and the
    routes of this node (``meet``, ``out``, ``back``), each a dict whose
    ``kind`` names the route."""

    def __init__(self, doc: Mapping[str, Any]):
        self.doc = doc
        self.version = int(doc.get("version", 1))
        trial = doc.get("trial") or {}
        world = doc.get("world") or {}
        channel = doc.get("channel") or {}
        self.trial_id: str = trial.get("id", "")
        self.trial_dir: str = str(trial.get("dir", ""))
        self.config: Dict[str, Any] = trial.get("config") if isinstance(trial.get("config"), dict) else {}
        self.start_iteration: int = int(trial.get("start_iteration", 0))
        self.checkpoint_frequency: int = int(trial.get("checkpoint_frequency", 0))
        self.experiment_name: str = trial.get("experiment_name", "")
        self.storage_path: str = trial.get("storage_path", "")
        self.world_size: int = int(world.get("size", 1))
        self.use_gpu: bool = bool(world.get("use_gpu", False))
        self.torch_backend: str = world.get("torch_backend", "")
        self.collective_timeout_s: float = float(world.get("collective_timeout_s", 1800))
        self.addr: str = channel.get("addr", "")
        self.tls_ca: str = channel.get("tls_ca") or ""
        self.datasets: Optional[str] = doc.get("datasets")
        self.preemption: Optional[Dict[str, Any]] = doc.get("preemption")
        routes = doc.get("routes") or {}
        unshared = doc.get("unshared")
        # Where the placement could not tell: the routes without the
        # experiment's directory on a node that does not see its probe.
        if unshared and not os.path.exists(unshared.get("probe", "")):
            routes = unshared.get("routes") or routes
        self.meet: Dict[str, Any] = routes.get("meet") or {"kind": "master"}
        self.out: Dict[str, Any] = routes.get("out") or {"kind": "in_place"}
        self.back: Dict[str, Any] = routes.get("back") or {"kind": "none"}

    def upload(self) -> Optional[Dict[str, Any]]:
        """The object store this rank uploads its shards to itself (``store``, ``uploader``), if any."""
        return self.out if self.out.get("kind") == "upload" else None

    def out_after_upload(self) -> Dict[str, Any]:
        """Where a checkpoint goes when it is not uploaded (none to upload to, or an upload failed)."""
        if self.out.get("kind") == "upload":
            return self.out.get("otherwise") or {"kind": "in_place"}
        return self.out

    def shard_path(self, rank: int) -> Optional[str]:
        """This rank's shard of a checkpoint this node sees: its own, or rank 0's where it saved none."""
        if self.back.get("kind") != "local":
            return None
        checkpoint = str(self.back["checkpoint"])
        own = os.path.join(checkpoint, f"rank-{rank}")
        return own if rank == 0 or os.path.isdir(own) else os.path.join(checkpoint, "rank-0")


def from_json(text: str) -> Plan:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(f"{PLAN_VAR} is not a run plan nestor can read: {e}") from None
    if not isinstance(doc, dict):
        raise PlanError(f"{PLAN_VAR} is not a run plan nestor can read: not a JSON object")
    version = int(doc.get("version", 0))
    if version > PLAN_VERSION:
        raise PlanError(f"{PLAN_VAR} is a version {version} plan; this nestor reads up to version {PLAN_VERSION} "
                        "(use the same nestor on the nodes as the driver)")
    return Plan(doc)


def _legacy(env: Mapping[str, str]) -> Optional[Plan]:
    """A plan from the variables of the protocol before the plan, or None outside nestor."""
    def get(k: str) -> str:
        return env.get(k) or ""

    if not (get("NESTOR_ADDR") and get("NESTOR_TRIAL_ID")):
        return None
    try:
        config = json.loads(get("NESTOR_CONFIG") or "{}")
    except json.JSONDecodeError as e:
        raise PlanError(f"NESTOR_CONFIG is not JSON: {e}") from None
    if get("NESTOR_SHIP_CHECKPOINTS") == "1":
        then: Dict[str, Any] = {"kind": "ship"}
    elif get("NESTOR_CHECKPOINT_STAGING"):
        then = {"kind": "stage", "dir": get("NESTOR_CHECKPOINT_STAGING")}
    else:
        then = {"kind": "in_place"}
    out = then
    if get("NESTOR_CHECKPOINT_STORE"):
        out = {"kind": "upload", "store": get("NESTOR_CHECKPOINT_STORE"), "otherwise": then}
        if get("NESTOR_UPLOADER"):
            out["uploader"] = get("NESTOR_UPLOADER")
    if get("NESTOR_CHECKPOINT_FETCH") == "1":
        back: Dict[str, Any] = {"kind": "driver"}
    elif get("NESTOR_CHECKPOINT"):
        back = {"kind": "local", "checkpoint": os.path.dirname(get("NESTOR_CHECKPOINT").rstrip("/"))}
    else:
        back = {"kind": "none"}
    if get("NESTOR_RENDEZVOUS") == "driver":
        meet: Dict[str, Any] = {"kind": "driver"}
    elif get("NESTOR_RENDEZVOUS_FILE"):
        meet = {"kind": "file", "path": get("NESTOR_RENDEZVOUS_FILE")}
    else:
        meet = {"kind": "master"}

    def number(k: str, default: float) -> float:
        value = get(k)
        try:
            return float(value) if value else default
        except ValueError:
            raise PlanError(f"{k}={value!r} is not a number") from None

    use_gpu = get("NESTOR_USE_GPU") == "1"
    doc = {
        "version": 1,
        "trial": {"id": get("NESTOR_TRIAL_ID"), "dir": get("NESTOR_TRIAL_DIR"), "config": config,
                  "start_iteration": int(number("NESTOR_START_ITERATION", 0)),
                  "checkpoint_frequency": int(number("NESTOR_CHECKPOINT_FREQUENCY", 0)),
                  "experiment_name": get("NESTOR_EXPERIMENT_NAME"), "storage_path": get("NESTOR_STORAGE_PATH")},
        "world": {"size": int(number("WORLD_SIZE", 1)), "use_gpu": use_gpu,
                  "torch_backend": get("NESTOR_TORCH_BACKEND") or ("nccl" if use_gpu else "gloo"),
                  "collective_timeout_s": number("NESTOR_COLLECTIVE_TIMEOUT_S", 1800)},
        "channel": {"addr": get("NESTOR_ADDR"), "tls_ca": get("NESTOR_TLS_CA") or None},
        "routes": {"meet": meet, "out": out, "back": back},
        "datasets": get("NESTOR_DATASETS") or None,
        "preemption": {"signal": get("NESTOR_PREEMPTION_SIGNAL"), "notice_s": int(number("NESTOR_PREEMPTION_NOTICE_S", 0))}
        if get("NESTOR_PREEMPTION_SIGNAL") else None,
    }
    return Plan(doc)


def from_env(env: Optional[Mapping[str, str]] = None) -> Optional[Plan]:
    """The plan in ``env`` (this process's environment by default): ``NESTOR_RUN``,
    else the older variables; None outside nestor."""
    env = os.environ if env is None else env
    text = env.get(PLAN_VAR)
    if text:
        return from_json(text)
    return _legacy(env)


_cached: "tuple[Optional[str], Optional[Plan]]" = ("\0", None)


def plan() -> Optional[Plan]:
    """This process's plan (read again when ``NESTOR_RUN`` changes: a warm
    process forks ranks of different runs), or None outside nestor."""
    global _cached
    text = os.environ.get(PLAN_VAR)
    if _cached[0] != text or text is None:
        _cached = (text, from_env())
    return _cached[1]


def token() -> str:
    """The run's token (a bearer secret: never written, never in the plan)."""
    return os.environ.get(TOKEN_VAR, "")


def inside() -> bool:
    """Whether this process is a rank of a nestor run (a plan with a driver
    to report to; a plan without one, written by hand, runs locally)."""
    p = plan()
    return p is not None and bool(p.addr)
