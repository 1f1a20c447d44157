"""Ray Tune's logger callbacks (``ray.tune.logger``), as nestor's loggers.

They run in the nestor binary, fed every durable result: pass them in
``RunConfig(callbacks=[...])`` as with Ray. ``TBXLoggerCallback`` writes
TensorBoard event files into each trial's directory (no tensorboardX
needed); nestor always writes ``result.jsonl`` and ``progress.csv``, so the
JSON and CSV loggers need nothing done.
"""

from typing import Any, Dict, List, Optional

from .._callback import Callback, Trial


class LoggerCallback(Callback):
    """Ray's base of loggers: a subclass's ``log_trial_*`` methods run in the
    script's process, fed by the callback hooks (``nestor.tune.callback``).
    nestor's own loggers below run in the binary instead (each becomes a
    ``[[callbacks]]`` table)."""

    def log_trial_start(self, trial: Trial) -> None:
        """The trial's first run started."""

    def log_trial_restore(self, trial: Trial) -> None:
        """The trial runs again from a checkpoint."""

    def log_trial_save(self, trial: Trial) -> None:
        """A checkpoint of the trial was committed."""

    def log_trial_result(self, iteration: int, trial: Trial, result: Dict[str, Any]) -> None:
        """A result, durable in the store."""

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """The trial ended (``failed``: in ERROR)."""

    def on_trial_start(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_start(trial)

    def on_trial_restore(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_restore(trial)

    def on_trial_save(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_save(trial)

    def on_trial_result(self, iteration: int, trials: List[Trial], trial: Trial, result: Dict[str, Any], **info: Any) -> None:
        self.log_trial_result(iteration, trial, result)

    def on_trial_complete(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_end(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_end(trial, failed=True)


class _BinaryLogger(LoggerCallback):
    """A logger nestor runs in the binary: it becomes one ``[[callbacks]]`` table."""

    def _table(self) -> Optional[Dict[str, Any]]:
        raise NotImplementedError


class TBXLoggerCallback(_BinaryLogger):
    """TensorBoard event files per trial: ``tensorboard --logdir <experiment>``."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def _table(self) -> Dict[str, Any]:
        t: Dict[str, Any] = {"type": "tensorboard"}
        if self.prefix:
            t["prefix"] = self.prefix
        return t


class JsonLoggerCallback(_BinaryLogger):
    """Each trial's ``result.jsonl``: nestor writes it always."""

    def _table(self) -> None:
        return None


class CSVLoggerCallback(_BinaryLogger):
    """Each trial's ``progress.csv``: nestor writes it always."""

    def _table(self) -> None:
        return None


__all__ = ["CSVLoggerCallback", "JsonLoggerCallback", "LoggerCallback", "TBXLoggerCallback", "pretty_print"]


def pretty_print(result: Dict[str, Any], exclude: Optional[set] = None) -> str:
    """A result as Ray prints it: YAML (JSON where PyYAML is missing), its
    bookkeeping keys and those in ``exclude`` left out."""
    import json

    skip = {"config", "hist_stats"} | set(exclude or ())
    shown = {k: v for k, v in result.items() if k not in skip and v is not None}
    try:
        import yaml

        return yaml.safe_dump(json.loads(json.dumps(shown, default=str)), default_flow_style=False, sort_keys=True)
    except ImportError:
        return json.dumps(shown, indent=2, sort_keys=True, default=str)

