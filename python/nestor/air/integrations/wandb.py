"""``ray.air.integrations.wandb.WandbLoggerCallback``, run by nestor: one
W&B run per trial, logged by W&B's own package in one helper process
(this Python), grouped under the sweep."""

import sys
from typing import Any, Dict, List, Optional

from ...tune.logger import _BinaryLogger


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


__all__ = ["WandbLoggerCallback"]
