"""Ray Tune's stoppers (``ray.tune.stopper``). A ``Stopper`` (or a function
``(trial_id, result) -> bool``) given as ``RunConfig(stop=...)`` runs in the
script's own process: the binary asks it after every result and waits for
the answer, so keep it quick. ``stop_all()`` is asked with it; when true the
sweep starts no new trial and stops the running ones.

A dict ``stop`` is checked by the binary itself (no Python call per result).
"""

import math
import time
from collections import defaultdict, deque
from typing import Any, Callable, Deque, Dict, Optional


class Stopper:
    """Decides from each result whether its trial (or the whole sweep) stops."""

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        raise NotImplementedError(f"{type(self).__name__}: a Stopper defines __call__(trial_id, result) -> bool")

    def stop_all(self) -> bool:
        return False


class NoopStopper(Stopper):
    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        return False


class FunctionStopper(Stopper):
    """A function ``(trial_id, result) -> bool`` as a stopper."""

    def __init__(self, function: Callable[[str, Dict[str, Any]], bool]):
        if not callable(function):
            raise ValueError(f"FunctionStopper: {function!r} is not callable")
        self._fn = function

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        return bool(self._fn(trial_id, result))

    @classmethod
    def is_valid_function(cls, fn: Any) -> bool:
        return callable(fn) and not isinstance(fn, Stopper)


class CombinedStopper(Stopper):
    """Stops when any of its stoppers does (every one sees every result)."""

    def __init__(self, *stoppers: Stopper):
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        return any([s(trial_id, result) for s in self._stoppers])

    def stop_all(self) -> bool:
        return any([s.stop_all() for s in self._stoppers])


class MaximumIterationStopper(Stopper):
    """A trial stops after ``max_iter`` results."""

    def __init__(self, max_iter: int):
        self._max = max_iter
        self._counts: Dict[str, int] = defaultdict(int)

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        self._counts[trial_id] += 1
        return self._counts[trial_id] >= self._max


class TrialPlateauStopper(Stopper):
    """A trial stops once the standard deviation of its last ``num_results``
    values of ``metric`` is at most ``std`` (after ``grace_period`` results),
    or once the metric passes ``metric_threshold`` in ``mode``'s direction."""

    def __init__(self, metric: str, std: float = 0.01, num_results: int = 4, grace_period: int = 4,
                 metric_threshold: Optional[float] = None, mode: Optional[str] = None):
        if metric_threshold is not None and mode not in ("min", "max"):
            raise ValueError("TrialPlateauStopper: metric_threshold needs mode='min' or 'max'")
        self._metric, self._std, self._n, self._grace = metric, std, num_results, grace_period
        self._threshold, self._mode = metric_threshold, mode
        self._iters: Dict[str, int] = defaultdict(int)
        self._window: Dict[str, Deque[float]] = defaultdict(lambda: deque(maxlen=self._n))

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        value = result.get(self._metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        self._iters[trial_id] += 1
        window = self._window[trial_id]
        window.append(float(value))
        if self._threshold is not None:
            if (self._mode == "min" and value > self._threshold) or (self._mode == "max" and value < self._threshold):
                return False
        if self._iters[trial_id] < self._grace or len(window) < self._n:
            return False
        mean = sum(window) / len(window)
        std = math.sqrt(sum((v - mean) ** 2 for v in window) / len(window))
        return std <= self._std


class ExperimentPlateauStopper(Stopper):
    """The whole sweep stops once the best ``top`` values of ``metric`` have
    a standard deviation of at most ``std`` for ``patience`` results in a row."""

    def __init__(self, metric: str, std: float = 0.001, top: int = 10, mode: str = "min", patience: int = 0):
        if mode not in ("min", "max"):
            raise ValueError("ExperimentPlateauStopper: mode must be 'min' or 'max'")
        self._metric, self._std, self._top, self._mode, self._patience = metric, std, top, mode, patience
        self._values: list = []
        self._calm = 0

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        value = result.get(self._metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            self._values.append(float(value))
            self._values.sort(reverse=self._mode == "max")
            del self._values[self._top:]
        if len(self._values) >= self._top:
            mean = sum(self._values) / len(self._values)
            std = math.sqrt(sum((v - mean) ** 2 for v in self._values) / len(self._values))
            self._calm = self._calm + 1 if std <= self._std else 0
        return self.stop_all()

    def stop_all(self) -> bool:
        return len(self._values) >= self._top and self._calm > self._patience


class TimeoutStopper(Stopper):
    """The whole sweep stops ``timeout`` seconds (or a ``timedelta``) after it started."""

    def __init__(self, timeout: Any):
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
        self._deadline = time.monotonic() + seconds

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return time.monotonic() >= self._deadline


__all__ = [
    "CombinedStopper", "ExperimentPlateauStopper", "FunctionStopper", "MaximumIterationStopper", "NoopStopper", "Stopper",
    "TimeoutStopper", "TrialPlateauStopper",
]
