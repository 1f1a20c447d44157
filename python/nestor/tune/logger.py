"""Ray Tune's logger callbacks (``ray.tune.logger``), as nestor's loggers.

They run in the nestor binary, fed every durable result: pass them in
``RunConfig(callbacks=[...])`` as with Ray. ``TBXLoggerCallback`` writes
TensorBoard event files into each trial's directory (no tensorboardX
needed); nestor always writes ``result.jsonl`` and ``progress.csv``, so the
JSON and CSV loggers need nothing done.
"""

from typing import Any, Dict, Optional


class LoggerCallback:
    """A logger that nestor runs: it becomes one ``[[callbacks]]`` table."""

    def _table(self) -> Optional[Dict[str, Any]]:
        raise NotImplementedError


class TBXLoggerCallback(LoggerCallback):
    """TensorBoard event files per trial: ``tensorboard --logdir <experiment>``."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def _table(self) -> Dict[str, Any]:
        t: Dict[str, Any] = {"type": "tensorboard"}
        if self.prefix:
            t["prefix"] = self.prefix
        return t


class JsonLoggerCallback(LoggerCallback):
    """Each trial's ``result.jsonl``: nestor writes it always."""

    def _table(self) -> None:
        return None


class CSVLoggerCallback(LoggerCallback):
    """Each trial's ``progress.csv``: nestor writes it always."""

    def _table(self) -> None:
        return None


__all__ = ["CSVLoggerCallback", "JsonLoggerCallback", "LoggerCallback", "TBXLoggerCallback"]
