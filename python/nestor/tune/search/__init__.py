"""Search algorithms under Ray Tune's names (``ray.tune.search``), for the
searchers nestor has: random and grid (``BasicVariantGenerator``), TPE in
``OptunaSearch``'s place, BOHB (``TuneBOHB``), and the ``ConcurrencyLimiter``
and ``Repeater`` wrappers. Each is written into the experiment's
``[search]`` table; the binary's searcher suggests the configs."""

import sys
from typing import Any, Dict, List, Mapping, Optional

from .._space import _constant


class Searcher:
    """The base of every search algorithm here."""

    _algorithm = "random"

    def __init__(self, metric: Optional[str] = None, mode: Optional[str] = None,
                 points_to_evaluate: Optional[List[Mapping[str, Any]]] = None, **settings: Any):
        self.metric, self.mode = metric, mode
        self._points = [_constant(f"points_to_evaluate[{i}]", dict(p)) for i, p in enumerate(points_to_evaluate or [])]
        self._settings = {k: v for k, v in settings.items() if v is not None}

    def _table(self) -> Dict[str, Any]:
        t: Dict[str, Any] = {"algorithm": self._algorithm, **self._settings}
        if self._points:
            t["points_to_evaluate"] = self._points
        return t


class BasicVariantGenerator(Searcher):
    """Random search, with grid axes expanded (Tune's default)."""

    def __init__(self, points_to_evaluate: Optional[List[Mapping[str, Any]]] = None, max_concurrent: int = 0,
                 constant_grid_search: bool = False, random_state: Any = None):
        super().__init__(points_to_evaluate=points_to_evaluate, max_concurrent=max_concurrent or None)
        if random_state is not None:
            print("nestor: BasicVariantGenerator(random_state=...) is ignored: seed the sweep with TuneConfig(seed=...)", file=sys.stderr)


class OptunaSearch(Searcher):
    """Tree-structured Parzen estimators (Optuna's default sampler), run by nestor's TPE."""

    _algorithm = "tpe"

    def __init__(self, space: Any = None, metric: Optional[str] = None, mode: Optional[str] = None,
                 points_to_evaluate: Optional[List[Mapping[str, Any]]] = None, sampler: Any = None, seed: Optional[int] = None,
                 evaluated_rewards: Any = None, n_startup_trials: Optional[int] = None, multivariate: Optional[bool] = None):
        #: A define-by-run space (a function of an Optuna trial): run by Optuna itself, in the script.
        self._define_by_run = space if callable(space) else None
        if space is not None and self._define_by_run is None:
            raise ValueError("OptunaSearch(space=...): give the space as the Tuner's param_space instead (or a "
                             "define-by-run function of an optuna.Trial)")
        if self._define_by_run is not None and points_to_evaluate:
            raise ValueError("OptunaSearch(space=fn, points_to_evaluate=...): enqueue them in the function's study instead")
        self._sampler = sampler if self._define_by_run is not None else None
        if evaluated_rewards is not None:
            raise ValueError("OptunaSearch(evaluated_rewards=...) is not supported: leave it out")
        if sampler is not None and self._define_by_run is None:
            # Optuna's TPESampler settings that nestor's TPE shares.
            n_startup_trials = n_startup_trials or getattr(sampler, "_n_startup_trials", None)
            multivariate = multivariate if multivariate is not None else getattr(sampler, "_multivariate", None)
            print("nestor: OptunaSearch(sampler=...) runs nestor's TPE; other samplers are not available", file=sys.stderr)
        super().__init__(metric, mode, points_to_evaluate, n_startup_trials=n_startup_trials, multivariate=multivariate)
        self.seed = seed

    def _table(self) -> Dict[str, Any]:
        # A define-by-run search is the driver's (the `search` hook): the binary's own searcher is not used.
        return {} if self._define_by_run is not None else super()._table()

    def _python(self, metric: Optional[str], mode: Optional[str], seed: Optional[int]) -> Any:
        """The driver's searcher for a define-by-run space, or None."""
        if self._define_by_run is None:
            return None
        from ..._hooks import DefineByRun

        return DefineByRun(self._define_by_run, self.metric or metric, self.mode or mode, self._sampler,
                           self.seed if self.seed is not None else seed)


class TPESearch(OptunaSearch):
    """nestor's own name for the TPE searcher."""


class TuneBOHB(Searcher):
    """BOHB: TPE models per budget, for HyperBandForBOHB's brackets."""

    _algorithm = "bohb"

    def __init__(self, space: Any = None, bohb_config: Optional[Mapping[str, Any]] = None, metric: Optional[str] = None,
                 mode: Optional[str] = None, points_to_evaluate: Optional[List[Mapping[str, Any]]] = None,
                 seed: Optional[int] = None, max_concurrent: int = 0):
        if space is not None:
            raise ValueError("TuneBOHB(space=...): give the space as the Tuner's param_space instead")
        c = dict(bohb_config or {})
        known = {"min_points_in_model", "top_n_percent", "random_fraction", "bandwidth_factor", "num_samples"}
        unknown = set(c) - known
        if unknown:
            raise ValueError(f"TuneBOHB(bohb_config=...): unknown keys {sorted(unknown)}; nestor's BOHB takes {sorted(known)}")
        super().__init__(metric, mode, points_to_evaluate, min_points_in_model=c.get("min_points_in_model"),
                         top_n_percent=c.get("top_n_percent"), random_fraction=c.get("random_fraction"),
                         bandwidth_factor=c.get("bandwidth_factor"), n_ei_candidates=c.get("num_samples"),
                         max_concurrent=max_concurrent or None)
        self.seed = seed


class ConcurrencyLimiter(Searcher):
    """At most ``max_concurrent`` of the searcher's trials live at once."""

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False):
        if not isinstance(searcher, Searcher):
            raise TypeError(f"ConcurrencyLimiter wraps one of nestor.tune.search's searchers, not {type(searcher).__name__}")
        if max_concurrent < 1:
            raise ValueError("ConcurrencyLimiter: max_concurrent must be at least 1")
        self.searcher, self.metric, self.mode = searcher, searcher.metric, searcher.mode
        self.max_concurrent = max_concurrent

    def _table(self) -> Dict[str, Any]:
        return {**self.searcher._table(), "max_concurrent": int(self.max_concurrent)}


class Repeater(Searcher):
    """Each config ``repeat`` times (``__trial_index__`` in the config); the searcher learns the mean."""

    def __init__(self, searcher: Searcher, repeat: int = 1, set_index: bool = True):
        if not isinstance(searcher, Searcher):
            raise TypeError(f"Repeater wraps one of nestor.tune.search's searchers, not {type(searcher).__name__}")
        if not set_index:
            print("nestor: Repeater(set_index=False) is ignored: the config always holds __trial_index__", file=sys.stderr)
        self.searcher, self.metric, self.mode, self.repeat = searcher, searcher.metric, searcher.mode, repeat

    def _table(self) -> Dict[str, Any]:
        return {**self.searcher._table(), "repeat": int(self.repeat)}


_NAMES = {"variant_generator": BasicVariantGenerator, "random": BasicVariantGenerator, "optuna": OptunaSearch,
          "tpe": OptunaSearch, "bohb": TuneBOHB}


def create_searcher(search_alg: str, **kwargs: Any) -> Searcher:
    """A searcher by Ray's short name; those nestor does not have are refused by name."""
    try:
        return _NAMES[search_alg](**kwargs)
    except KeyError:
        raise ValueError(
            f"search algorithm {search_alg!r} is not in nestor; it has {sorted(_NAMES)} (TPE stands in for optuna, "
            "hyperopt and bayesopt)"
        ) from None


__all__ = ["Searcher", "BasicVariantGenerator", "OptunaSearch", "TPESearch", "TuneBOHB", "ConcurrencyLimiter", "Repeater",
           "create_searcher"]
