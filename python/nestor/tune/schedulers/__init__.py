"""Trial schedulers under Ray Tune's names (``ray.tune.schedulers``). Each is
a description the driver writes into the experiment's ``[scheduler]`` table;
the binary's scheduler of that type decides (no scheduling in Python)."""

import functools
import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from ..._toml import Inline
from .._space import Domain, _constant


def _note(what: str) -> None:
    import sys

    print(f"nestor: {what}", file=sys.stderr)


def _sends_what_is_set(init: Callable[..., None]) -> Callable[..., None]:
    """Makes a scheduler's table hold only the arguments its caller gave:
    the binary fills in the rest, so a Python and a TOML sweep of the same
    settings are the same sweep (its defaults are Ray's)."""
    sig = inspect.signature(init)
    params = set(sig.parameters) - {"self"}

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        self._unset = params - set(sig.bind(self, *args, **kwargs).arguments)
        init(self, *args, **kwargs)

    return wrapper


class TrialScheduler:
    """The base of every scheduler here."""

    _type = "fifo"

    def __init__(self, **settings: Any):
        unset = getattr(self, "_unset", set())
        self._settings = {k: v for k, v in settings.items() if v is not None and k not in unset}

    def _table(self) -> Dict[str, Any]:
        return {"type": self._type, **self._settings}

    @property
    def metric(self) -> Optional[str]:
        return self._settings.get("metric")

    @property
    def mode(self) -> Optional[str]:
        return self._settings.get("mode")


class FIFOScheduler(TrialScheduler):
    """Runs every trial to its end."""

    def __init__(self, **_ignored: Any):
        super().__init__()


class AsyncHyperBandScheduler(TrialScheduler):
    """ASHA (stopping): a trial at a rung goes on only if it is in the top
    1/reduction_factor of the results there."""

    _type = "asha"

    @_sends_what_is_set
    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        max_t: float = 100,
        grace_period: float = 1,
        reduction_factor: float = 4,
        brackets: int = 1,
        stop_last_trials: bool = True,
    ):
        if not stop_last_trials:
            _note("ASHAScheduler(stop_last_trials=False) is not supported: trials that reach max_t end there")
        super().__init__(
            time_attr=time_attr, metric=metric, mode=mode, max_t=float(max_t), grace_period=float(grace_period),
            reduction_factor=float(reduction_factor), brackets=int(brackets),
        )


ASHAScheduler = AsyncHyperBandScheduler


class HyperBandScheduler(TrialScheduler):
    """Synchronous HyperBand: brackets of successive halving, pausing trials at each milestone."""

    _type = "hyperband"

    @_sends_what_is_set
    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        max_t: float = 81,
        reduction_factor: float = 3,
        stop_last_trials: bool = True,
    ):
        if not stop_last_trials:
            _note("HyperBandScheduler(stop_last_trials=False) is not supported: trials that reach max_t end there")
        super().__init__(time_attr=time_attr, metric=metric, mode=mode, max_t=float(max_t), reduction_factor=float(reduction_factor))


class HyperBandForBOHB(HyperBandScheduler):
    """HyperBand for ``TuneBOHB``: brackets filled largest first."""

    _type = "hyperband_bohb"


class MedianStoppingRule(TrialScheduler):
    """Stops a trial whose best result is worse than the median of the others' running averages."""

    _type = "median_stopping"

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        grace_period: float = 60.0,
        min_samples_required: int = 3,
        min_time_slice: float = 0,
        hard_stop: bool = True,
    ):
        if min_time_slice:
            _note("MedianStoppingRule(min_time_slice=...) has no meaning in nestor (trials are not time-sliced): ignored")
        super().__init__(
            time_attr=time_attr, metric=metric, mode=mode, grace_period=float(grace_period),
            min_samples_required=int(min_samples_required), hard_stop=bool(hard_stop),
        )


class LearningCurveScheduler(TrialScheduler):
    """nestor's learning-curve scheduler (no Ray counterpart): at checks
    ``grace_period * growth**k`` it fits the trial's curve so far, predicts
    its value at ``max_t`` with its uncertainty, and stops it when its chance
    of beating the best so far, scaled by the share of ``max_t`` still ahead
    of it, is below ``threshold``. ``time_attr`` is best a cost
    (``samples_seen``, ``flops``)."""

    _type = "learning_curve"

    @_sends_what_is_set
    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        max_t: float = 100,
        grace_period: Optional[float] = None,
        growth: float = 2,
        threshold: float = 0.1,
    ):
        super().__init__(
            time_attr=time_attr, metric=metric, mode=mode, max_t=float(max_t),
            grace_period=None if grace_period is None else float(grace_period), growth=float(growth), threshold=float(threshold),
        )


def _mutations(name: str, mutations: Optional[Mapping[str, Any]], callables: Dict[str, Any],
               prefix: str = "") -> Dict[str, Any]:
    """The mutations the binary explores itself (domains, lists); functions go
    to ``callables`` by dotted path, for the driver's explore step."""
    out: Dict[str, Any] = {}
    for key, v in (mutations or {}).items():
        if isinstance(v, Domain):
            out[key] = v._toml()
        elif callable(v):
            callables[prefix + key] = v
        elif isinstance(v, Mapping):
            inner = _mutations(name, v, callables, prefix + key + ".")
            if inner:
                out[key] = inner
        else:
            out[key] = _constant(f"hyperparam_mutations.{key}", v)
    return out


class PopulationBasedTraining(TrialScheduler):
    """PBT: at each perturbation interval the bottom quantile copies a top
    trial's checkpoint and explores its config."""

    _type = "pbt"

    @_sends_what_is_set
    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        perturbation_interval: float = 60.0,
        burn_in_period: float = 0.0,
        hyperparam_mutations: Optional[Mapping[str, Any]] = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: Sequence[float] = (1.2, 0.8),
        custom_explore_fn: Optional[Callable[..., Any]] = None,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
    ):
        if custom_explore_fn is not None and not callable(custom_explore_fn):
            raise ValueError(f"PopulationBasedTraining(custom_explore_fn={custom_explore_fn!r}): give a function config -> config")
        super().__init__(
            time_attr=time_attr, metric=metric, mode=mode, perturbation_interval=float(perturbation_interval),
            burn_in_period=float(burn_in_period), quantile_fraction=float(quantile_fraction),
            resample_probability=float(resample_probability),
            perturbation_factors=[float(f) for f in perturbation_factors], synch=bool(synch),
        )
        callables: Dict[str, Any] = {}
        self._settings["hyperparam_mutations"] = _mutations("PopulationBasedTraining", hyperparam_mutations, callables)
        self._callables = callables
        self._custom_explore = custom_explore_fn

    def _explore(self) -> Any:
        """The driver's part of the explore step (callable mutations, custom_explore_fn), or None."""
        if not self._callables and self._custom_explore is None:
            return None
        from ..._hooks import Explore

        return Explore(self._callables, self._custom_explore)


class PB2(TrialScheduler):
    """Population-based bandits: PBT whose explore step is GP-UCB over ``hyperparam_bounds``."""

    _type = "pb2"

    @_sends_what_is_set
    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        perturbation_interval: float = 60.0,
        hyperparam_bounds: Optional[Mapping[str, Sequence[float]]] = None,
        quantile_fraction: float = 0.25,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
        burn_in_period: float = 0.0,
    ):
        super().__init__(
            time_attr=time_attr, metric=metric, mode=mode, perturbation_interval=float(perturbation_interval),
            quantile_fraction=float(quantile_fraction), burn_in_period=float(burn_in_period), synch=bool(synch),
        )
        self._settings["hyperparam_bounds"] = {k: [float(x) for x in v] for k, v in (hyperparam_bounds or {}).items()}


class DistributeResources:
    """An even share of the free workers for every running trial (the default)."""

    _allocation = "distribute"

    def __init__(self, add_bundles: bool = False, increase_by: Any = None, increase_by_times: int = -1, reserve_resources: Any = None):
        pass


class DistributeResourcesToTopJob(DistributeResources):
    """The free workers to the best trial."""

    _allocation = "top_job"

    def __init__(self, add_bundles: bool = False, increase_by: Any = None, increase_by_times: int = -1,
                 reserve_resources: Any = None, metric: Optional[str] = None, mode: Optional[str] = None):
        self.metric, self.mode = metric, mode


class ResourceChangingScheduler(TrialScheduler):
    """Another scheduler, with trials' numbers of workers changed at checkpoints."""

    _type = "resource_changing"

    def __init__(self, base_scheduler: Optional[TrialScheduler] = None, resources_allocation_function: Any = None,
                 max_workers: Optional[int] = None):
        alloc = resources_allocation_function or DistributeResources()
        if not isinstance(alloc, DistributeResources):
            raise ValueError(
                "ResourceChangingScheduler: resources_allocation_function must be DistributeResources() or "
                "DistributeResourcesToTopJob(); the binary cannot call a Python function"
            )
        super().__init__(allocation=alloc._allocation, max_workers=max_workers,
                         metric=getattr(alloc, "metric", None), mode=getattr(alloc, "mode", None))
        self._base = base_scheduler or FIFOScheduler()

    def _table(self) -> Dict[str, Any]:
        return {**super()._table(), "base": self._base._table()}


_NAMES = {
    "fifo": FIFOScheduler, "async_hyperband": ASHAScheduler, "asynchyperband": ASHAScheduler, "asha": ASHAScheduler,
    "median_stopping_rule": MedianStoppingRule, "medianstopping": MedianStoppingRule, "hyperband": HyperBandScheduler,
    "hb_bohb": HyperBandForBOHB, "pbt": PopulationBasedTraining, "pb2": PB2, "resource_changing": ResourceChangingScheduler,
    "learning_curve": LearningCurveScheduler,
}


def create_scheduler(scheduler: str, **kwargs: Any) -> TrialScheduler:
    """A scheduler by Ray's short name (``"async_hyperband"``, ``"pbt"`` ...)."""
    try:
        return _NAMES[scheduler](**kwargs)
    except KeyError:
        raise ValueError(f"unknown scheduler {scheduler!r}; one of {sorted(_NAMES)}") from None


__all__ = [
    "TrialScheduler", "FIFOScheduler", "AsyncHyperBandScheduler", "ASHAScheduler", "HyperBandScheduler", "HyperBandForBOHB",
    "MedianStoppingRule", "LearningCurveScheduler", "PopulationBasedTraining", "PB2", "ResourceChangingScheduler", "DistributeResources",
    "DistributeResourcesToTopJob", "create_scheduler",
]
