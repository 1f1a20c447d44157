"""``ray.air.integrations.wandb``: ``WandbLoggerCallback``, run by nestor
(one W&B run per trial, logged by W&B's own package in one helper process
(this Python), grouped under the sweep), and ``setup_wandb``, which a
training function calls to log to W&B itself."""

import os
import sys
from typing import Any, Dict, List, Optional

from ... import _contract
from ...tune.logger import _BinaryLogger
from . import _Noop


class WandbLoggerCallback(_BinaryLogger):
    """A run per trial; ``mode="offline"`` (or ``WANDB_MODE``) needs no network."""

    def __init__(self, project: Optional[str] = None, group: Optional[str] = None, api_key_file: Optional[str] = None,
                 api_key: Optional[str] = None, excludes: Optional[List[str]] = None, log_config: bool = False,
                 upload_checkpoints: bool = False, save_checkpoints: bool = False, upload_timeout: int = 1800,
                 **kwargs: Any) -> None:
        if api_key_file or api_key or upload_checkpoints or save_checkpoints or excludes:
            raise ValueError("WandbLoggerCallback: api_key(_file), excludes and checkpoint uploads are not supported by "
                             "nestor yet; log in with `wandb login` (or WANDB_API_KEY) instead")
        if group:
            raise ValueError("WandbLoggerCallback(group=...): nestor groups each sweep's runs under its experiment name")
        self.project = project
        self.entity = kwargs.pop("entity", None)
        self.mode = kwargs.pop("mode", None)
        self.tags = list(kwargs.pop("tags", None) or [])
        if kwargs:
            raise ValueError(f"WandbLoggerCallback: {', '.join(sorted(kwargs))} not supported by nestor")

    def _table(self) -> Dict[str, Any]:
        t: Dict[str, Any] = {"type": "wandb", "python": sys.executable}
        for k in ("project", "entity", "mode"):
            if getattr(self, k):
                t[k] = getattr(self, k)
        if self.tags:
            t["tags"] = self.tags
        return t


def setup_wandb(config: Optional[Dict[str, Any]] = None, api_key: Optional[str] = None, api_key_file: Optional[str] = None,
                rank_zero_only: bool = True, **kwargs: Any) -> Any:
    """Ray's ``setup_wandb``, in a training function: ``wandb.init`` for this
    trial (its id and name the trial's, grouped under the experiment, the
    config as the run's config; ``kwargs`` go to ``wandb.init`` and win) and
    returns the run. With ``rank_zero_only`` (the default) the other ranks
    get a stand-in whose calls do nothing. The key comes from ``api_key``,
    ``api_key_file`` or ``WANDB_API_KEY``, as in Ray."""
    from ... import get_context

    ctx = get_context()
    if rank_zero_only and ctx.world_rank != 0:
        return _Noop()
    try:
        import wandb
    except ImportError:
        raise ImportError("setup_wandb needs wandb in the training function's Python: pip install wandb") from None
    if api_key_file:
        with open(os.path.expanduser(api_key_file)) as f:
            api_key = f.readline().strip()
    if api_key:
        os.environ["WANDB_API_KEY"] = api_key
    plan = _contract.plan()
    experiment = (plan.experiment_name if plan else "") or None
    settings = {"id": ctx.trial_id if experiment is None else f"{experiment}-{ctx.trial_id}", "name": ctx.trial_id,
                "group": experiment, "resume": "allow", "config": dict(config or {})}
    settings.update(kwargs)
    return wandb.init(**settings)


__all__ = ["WandbLoggerCallback", "setup_wandb"]
