"""What the framework integrations share: importing the framework with an
error that names what to install, and the checkpoint a rank reports."""

import importlib
import os
import shutil
import tempfile
from typing import Any, Dict, Optional

from .. import _contract


def need(module: str, extra: str) -> Any:
    """``import module``, or an ImportError naming the package and the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        raise ImportError(
            f"nestor's {extra} integration needs {top}: pip install \"nestor[{extra}]\" "
            f"(or pip install {top}); importing it failed: {e}"
        ) from e


def free_port() -> int:
    """A TCP port free on this node now (a framework's rank listens on it next)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def lightning() -> Any:
    """Lightning's ``pytorch`` package: the one the training code imported
    already (``pytorch_lightning`` or ``lightning.pytorch``: its ``Trainer``
    takes only its own package's strategies), else ``lightning.pytorch``
    where installed, else ``pytorch_lightning``, else an ImportError naming the extra."""
    import sys

    imported = [m for m in ("lightning.pytorch", "pytorch_lightning") if m in sys.modules]
    if len(imported) == 1:
        return sys.modules[imported[0]]
    for module in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(module)
        except ImportError:
            continue
    return need("lightning.pytorch", "lightning")


def rank_reports_files(ctx: Any, path: str) -> bool:
    """Whether this rank's copy of a framework's checkpoint directory
    ``path`` goes with its report: rank 0's, and the first rank's of each
    other node, unless ``path`` is in the trial's directory and the nodes
    share it with the driver (rank 0's copy holds every file then). The
    ranks of a node share the directory the framework saved into, so one
    copy a node holds every rank's files; the checkpoint's view,
    ``get_checkpoint().as_directory()``, lays them together again."""
    if ctx.world_rank == 0:
        return True
    if ctx.local_rank != 0 or ctx.node_rank == 0:
        return False
    trial_dir = os.path.abspath(ctx.trial_dir)
    inside = os.path.commonpath([os.path.abspath(path), trial_dir]) == trial_dir
    plan = _contract.plan()
    return not (inside and not (plan and plan.back.get("kind") == "driver"))


def barrier() -> None:
    """Waits for every rank of the trial (a no-op without a process group)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def staging_dir(near: str) -> str:
    """A new temporary directory beside ``near`` (on its filesystem, so
    files can be linked into it, not copied), or in the system's temporary
    directory where ``near``'s parent is not writable."""
    parent = os.path.dirname(os.path.abspath(near))
    try:
        return tempfile.mkdtemp(prefix=".nestor-report-", dir=parent)
    except OSError:
        return tempfile.mkdtemp(prefix="nestor-report-")


def link_tree(src: str, dest: str) -> None:
    """``src``'s files at ``dest`` as hard links where the filesystem
    allows, copies where not (the report copies them into the trial's storage)."""

    def link_or_copy(a: str, b: str) -> Optional[str]:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
        return b

    shutil.copytree(src, dest, copy_function=link_or_copy)


def older_form(trainer: str, key: str, train_loop_config: Any, params: Any, label_column: Any, num_boost_round: int,
               datasets: Any, data_params: Dict[str, Any]) -> Dict[str, Any]:
    """The training function's config for Ray's older tree-trainer form
    (``params=``, ``label_column=``, ``datasets=``): the settings under
    ``key``, which the trainer's own training function reads."""
    if not label_column or not datasets or "train" not in datasets:
        raise ValueError(f"{trainer}: give train_loop_per_worker, or Ray's older form: params=, label_column= "
                         "and datasets={'train': ...} (num_boost_round=)")
    return {**(train_loop_config or {}), key: {"params": dict(params or {}), "label_column": label_column,
                                               "num_boost_round": int(num_boost_round), **data_params}}


def older_form_params(config: Dict[str, Any], key: str) -> "tuple[Dict[str, Any], int]":
    """The booster's params and rounds of the older form: the trainer's, then
    the trial's top-level keys (Tune's space may set them there), then the
    trial's ``params`` dict and ``num_boost_round``."""
    settings = config[key]
    params = dict(settings["params"])
    params.update({k: v for k, v in config.items() if k != key and not k.startswith("_")})
    overrides = config.get("__overrides__") or {}
    params.update(overrides.get("params") or {})
    return params, int(overrides.get("num_boost_round", settings["num_boost_round"]))
