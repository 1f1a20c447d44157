"""What a finished (or interrupted) experiment holds, read from its store
through the binary (``nestor export --format trials``, ``nestor best
--json``): Ray's ``Result`` and ``ResultGrid``."""

import json
import math
import os
import subprocess
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import _binary


class TrainingFailedError(RuntimeError):
    """A training run failed: the message names the rank, its node and its
    traceback (the tail of the rank's log)."""


def _num(v: Any) -> Any:
    # The store writes non-finite numbers as strings.
    if v == "NaN":
        return math.nan
    if v == "Infinity":
        return math.inf
    if v == "-Infinity":
        return -math.inf
    return v


def _metrics(m: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    return {k: _num(v) for k, v in (m or {}).items()}


class Result:
    """One trial's outcome: its last metrics, checkpoints, config and error."""

    def __init__(self, record: Dict[str, Any], experiment_path: str):
        from ._checkpoint import Checkpoint

        self._record = record
        self.trial_id: str = record["trial_id"]
        self.config: Dict[str, Any] = record.get("config") or {}
        self.status: str = record.get("status", "")
        self.metrics: Dict[str, Any] = _metrics(record.get("metrics"))
        if self.metrics:
            self.metrics.setdefault("trial_id", self.trial_id)
            self.metrics.setdefault("config", self.config)
        self.path: str = record.get("path") or os.path.join(experiment_path, "trials", self.trial_id)
        self.filesystem = None
        self._history: List[Dict[str, Any]] = [_metrics(r) for r in record.get("history") or []]
        cks = record.get("checkpoints") or []
        self.checkpoint: Optional[Checkpoint] = Checkpoint(cks[-1]["uri"]) if cks else None
        #: Every kept checkpoint with the metrics reported with it, oldest first.
        self.best_checkpoints: List[Tuple[Checkpoint, Dict[str, Any]]] = [
            (Checkpoint(c["uri"]), {**_metrics(c.get("metrics")), "training_iteration": c.get("training_iteration")}) for c in cks
        ]
        err = record.get("error")
        self.error: Optional[TrainingFailedError] = TrainingFailedError(f"trial {self.trial_id} failed: {err}") if err else None
        self.restarts: int = record.get("restarts", 0)

    @property
    def metrics_dataframe(self) -> Any:
        """Every result of the trial as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self._history)

    @property
    def metrics_history(self) -> List[Dict[str, Any]]:
        """Every result of the trial, oldest first."""
        return list(self._history)

    def get_best_checkpoint(self, metric: str, mode: str) -> Optional[Any]:
        """The kept checkpoint whose metrics score best (NaN last)."""
        sign = 1 if mode == "max" else -1
        scored = [(c, m.get(metric)) for c, m in self.best_checkpoints]
        scored = [(c, v) for c, v in scored if isinstance(v, (int, float)) and not math.isnan(v)]
        if not scored:
            return None
        return max(scored, key=lambda cv: sign * cv[1])[0]

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.metrics.items() if k not in ("config", "trial_id")}
        return f"Result(trial_id={self.trial_id!r}, status={self.status}, metrics={shown}, path={self.path!r}, checkpoint={self.checkpoint})"


class ResultGrid:
    """Every trial of an experiment (Ray's ``ResultGrid``): index, iterate,
    ``get_best_result``, ``get_dataframe``, ``errors``."""

    def __init__(self, experiment_path: str, metric: Optional[str] = None, mode: Optional[str] = None):
        self.experiment_path = os.path.abspath(experiment_path)
        self.filesystem = None
        self._metric, self._mode = metric, mode
        out = subprocess.run([_binary.find(), "export", self.experiment_path, "--format", "trials"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"cannot read the results of {self.experiment_path}: {out.stderr.strip()}")
        self._results = [Result(json.loads(line), self.experiment_path) for line in out.stdout.splitlines() if line.strip()]

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, i: int) -> Result:
        return self._results[i]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    def __repr__(self) -> str:
        return f"ResultGrid<{len(self)} trials, {self.num_errors} errors, {self.experiment_path}>"

    @property
    def errors(self) -> List[TrainingFailedError]:
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return sum(1 for r in self._results if r.status == "TERMINATED")

    def get_best_result(self, metric: Optional[str] = None, mode: Optional[str] = None, scope: str = "last",
                        filter_nan_and_inf: bool = True) -> Result:
        """The best trial by ``metric`` (default: the experiment's) in
        ``mode``; ``scope`` is last, avg, all, last-5-avg or last-10-avg.
        Ranked by the binary (``nestor best``): non-finite values rank last."""
        metric, mode = metric or self._metric, mode or self._mode
        args = [_binary.find(), "best", self.experiment_path, "--json", "--scope", scope]
        if metric:
            args += ["--metric", metric]
        if mode:
            args += ["--mode", mode]
        out = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if out.returncode == 2:
            # No metric or mode given, and the experiment sets none.
            raise ValueError(f"get_best_result: {out.stderr.strip().removeprefix('error: ')} (metric=, mode=)")
        if out.returncode != 0:
            raise RuntimeError(f"no best result: {out.stderr.strip().removeprefix('error: ')}")
        best = json.loads(out.stdout)["trial_id"]
        return next(r for r in self._results if r.trial_id == best)

    def get_dataframe(self, filter_metric: Optional[str] = None, filter_mode: Optional[str] = None) -> Any:
        """One row per trial (its last result, or its best by ``filter_metric``
        in ``filter_mode``), with ``config/...`` columns (needs pandas)."""
        import pandas as pd

        rows = []
        for r in self._results:
            hist = r.metrics_history
            row: Dict[str, Any] = dict(hist[-1]) if hist else {}
            if filter_metric and hist:
                sign = 1 if filter_mode == "max" else -1
                finite = [h for h in hist if isinstance(h.get(filter_metric), (int, float)) and not math.isnan(h[filter_metric])]
                if finite:
                    row = dict(max(finite, key=lambda h: sign * h[filter_metric]))
            row["trial_id"] = r.trial_id
            row["status"] = r.status
            row["logdir"] = r.path
            for k, v in _flatten(r.config).items():
                row[f"config/{k}"] = v
            rows.append(row)
        return pd.DataFrame(rows)


def _flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out
