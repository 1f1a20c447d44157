"""Search algorithms under Ray Tune's names (``ray.tune.search``), for the
searchers nestor has: random and grid (``BasicVariantGenerator``), TPE in
``OptunaSearch``'s place, BOHB (``TuneBOHB``), and the ``ConcurrencyLimiter``
and ``Repeater`` wrappers. Each is written into the experiment's
``[search]`` table; the binary's searcher suggests the configs."""

import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

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
    """Tree-structured Parzen estimators (Optuna's default sampler), run by
    nestor's TPE. A define-by-run ``space`` (a function of an Optuna trial),
    or several metrics (``metric=["loss", "gain"], mode=["min", "max"]``: a
    multi-objective search), run Optuna itself, in the script."""

    _algorithm = "tpe"

    def __init__(self, space: Any = None, metric: Optional[Union[str, List[str]]] = None,
                 mode: Optional[Union[str, List[str]]] = None,
                 points_to_evaluate: Optional[List[Mapping[str, Any]]] = None, sampler: Any = None, seed: Optional[int] = None,
                 evaluated_rewards: Any = None, n_startup_trials: Optional[int] = None, multivariate: Optional[bool] = None):
        #: Several objectives: (metrics, modes); the experiment's own metric is the first.
        self._objectives: Optional[Tuple[List[str], List[str]]] = None
        if isinstance(metric, (list, tuple)) or isinstance(mode, (list, tuple)):
            metrics = [metric] if isinstance(metric, str) else list(metric or [])
            modes = [mode] if isinstance(mode, str) else list(mode or [])
            if not metrics or len(metrics) != len(modes) or not all(isinstance(m, str) for m in metrics):
                raise ValueError(f"OptunaSearch: a multi-objective search takes as many modes as metrics, "
                                 f"got metric={metric!r} and mode={mode!r}")
            bad = [m for m in modes if m not in ("min", "max")]
            if bad:
                raise ValueError(f"OptunaSearch: mode {bad[0]!r} is not 'min' or 'max'")
            if points_to_evaluate:
                raise ValueError("OptunaSearch(points_to_evaluate=...) with several metrics: enqueue them in a study of your own")
            self._objectives = (metrics, modes)
            if len(metrics) > 1:
                print(f"nestor: OptunaSearch over {len(metrics)} objectives ({', '.join(f'{m} {o}' for m, o in zip(metrics, modes))}) "
                      f"runs Optuna itself in this script; schedulers and the best result go by {metrics[0]} unless told "
                      "another metric", file=sys.stderr)
            metric, mode = metrics[0], modes[0]
        #: A define-by-run space (a function of an Optuna trial): run by Optuna itself, in the script.
        self._define_by_run = space if callable(space) else None
        if space is not None and self._define_by_run is None:
            raise ValueError("OptunaSearch(space=...): give the space as the Tuner's param_space instead (or a "
                             "define-by-run function of an optuna.Trial)")
        if self._define_by_run is not None and points_to_evaluate:
            raise ValueError("OptunaSearch(space=fn, points_to_evaluate=...): enqueue them in the function's study instead")
        in_script = self._define_by_run is not None or (self._objectives is not None and len(self._objectives[0]) > 1)
        if self._objectives is not None and len(self._objectives[0]) == 1:
            self._objectives = None
        self._sampler = sampler if in_script else None
        if evaluated_rewards is not None:
            raise ValueError("OptunaSearch(evaluated_rewards=...) is not supported: leave it out")
        if sampler is not None and not in_script:
            # Optuna's TPESampler settings that nestor's TPE shares.
            n_startup_trials = n_startup_trials or getattr(sampler, "_n_startup_trials", None)
            multivariate = multivariate if multivariate is not None else getattr(sampler, "_multivariate", None)
            print("nestor: OptunaSearch(sampler=...) runs nestor's TPE; other samplers are not available", file=sys.stderr)
        super().__init__(metric, mode, points_to_evaluate, n_startup_trials=n_startup_trials, multivariate=multivariate)
        self.seed = seed

    def _table(self) -> Dict[str, Any]:
        # A search Optuna runs is the driver's (the `search` hook): the binary's own searcher is not used.
        return {} if self._define_by_run is not None or self._objectives is not None else super()._table()

    def _python(self, metric: Optional[str], mode: Optional[str], seed: Optional[int], param_space: Optional[Mapping[str, Any]] = None) -> Any:
        """The driver's searcher (Optuna's study) for a define-by-run space or several objectives, or None."""
        if self._define_by_run is None and self._objectives is None:
            return None
        from ..._hooks import DefineByRun

        space = self._define_by_run or _define_by_run_of(dict(param_space or {}))
        metrics, modes = self._objectives or ([self.metric or metric], [self.mode or mode])
        return DefineByRun(space, metrics, modes, self._sampler, self.seed if self.seed is not None else seed)


def _define_by_run_of(param_space: Mapping[str, Any]) -> Any:
    """A ``param_space`` of tune domains as an Optuna define-by-run
    function: each domain a ``trial.suggest_*`` named by its path
    (``a/b``), constants as they are. Grid axes, ``randn`` and
    ``sample_from`` have no Optuna form and are refused naming the key."""
    from .._space import Domain, _SampleFrom

    def check(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                check(v, f"{path}/{k}" if path else str(k))
        elif isinstance(node, _SampleFrom):
            raise ValueError(f"param_space[{path!r}]: tune.sample_from has no Optuna form; OptunaSearch over several "
                             "metrics takes tune.uniform, loguniform, randint, choice ... and constants")
        elif isinstance(node, Domain) and node.kind in ("grid", "randn", "qrandn"):
            raise ValueError(f"param_space[{path!r}]: tune.{node.kind} has no Optuna form; OptunaSearch over several "
                             "metrics takes tune.uniform, loguniform, randint, choice ... and constants")

    check(param_space, "")

    def suggest(trial: Any, d: Domain, name: str) -> Any:
        a = d.args
        if d.kind == "uniform":
            return trial.suggest_float(name, a[0], a[1])
        if d.kind == "quniform":
            return trial.suggest_float(name, a[0], a[1], step=a[2])
        if d.kind in ("loguniform", "qloguniform"):
            v = trial.suggest_float(name, a[0], a[1], log=True)
            return round(v / a[2]) * a[2] if d.kind == "qloguniform" else v
        if d.kind == "randint":
            return trial.suggest_int(name, a[0], a[1] - 1)
        if d.kind == "qrandint":
            return trial.suggest_int(name, a[0], a[1], step=a[2])
        if d.kind in ("lograndint", "qlograndint"):
            v = trial.suggest_int(name, a[0], a[1] - (1 if d.kind == "lograndint" else 0), log=True)
            return int(round(v / a[2]) * a[2]) if d.kind == "qlograndint" else v
        if d.kind == "choice":
            plain = all(v is None or isinstance(v, (bool, int, float, str)) for v in a)
            return trial.suggest_categorical(name, a) if plain else a[trial.suggest_categorical(name, list(range(len(a))))]
        raise ValueError(f"param_space[{name!r}]: tune.{d.kind} has no Optuna form")

    def space(trial: Any) -> Dict[str, Any]:
        values: Dict[str, Any] = {}

        def walk(node: Any, path: str) -> None:
            if isinstance(node, Mapping) and not isinstance(node, Domain):
                for k, v in node.items():
                    walk(v, f"{path}/{k}" if path else str(k))
            elif isinstance(node, Domain):
                values[path] = suggest(trial, node, path)
            else:
                values[path] = node

        walk(param_space, "")
        return values

    return space


class TPESearch(OptunaSearch):
    """nestor's own name for the TPE searcher."""


class HyperOptSearch(Searcher):
    """HyperOpt's algorithm, tree-structured Parzen estimators, run by
    nestor's TPE over the Tuner's ``param_space``, with HyperOpt's settings:
    ``n_initial_points`` random configs (default 20) before the model,
    ``random_state_seed`` the sweep's seed."""

    _algorithm = "tpe"

    def __init__(self, space: Optional[Dict[str, Any]] = None, metric: Optional[str] = None, mode: Optional[str] = None,
                 points_to_evaluate: Optional[List[Mapping[str, Any]]] = None, n_initial_points: int = 20,
                 random_state_seed: Optional[int] = None, gamma: float = 0.25, **kwargs: Any):
        if space is not None:
            raise ValueError("HyperOptSearch(space=...): a HyperOpt `hp` space does not run here; give the space as the "
                             "Tuner's param_space with tune.uniform, tune.choice ... (nestor's TPE runs it)")
        if kwargs:
            raise ValueError(f"HyperOptSearch: unknown arguments {sorted(kwargs)}")
        if gamma != 0.25:
            print("nestor: HyperOptSearch(gamma=...) is ignored: nestor's TPE splits good from bad configs as Optuna's does",
                  file=sys.stderr)
        if n_initial_points < 1:
            raise ValueError("HyperOptSearch: n_initial_points must be at least 1")
        super().__init__(metric, mode, points_to_evaluate, n_startup_trials=int(n_initial_points))
        self.seed = random_state_seed


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
          "tpe": OptunaSearch, "bohb": TuneBOHB, "hyperopt": HyperOptSearch}


def create_searcher(search_alg: str, **kwargs: Any) -> Searcher:
    """A searcher by Ray's short name; those nestor does not have are refused by name."""
    try:
        return _NAMES[search_alg](**kwargs)
    except KeyError:
        raise ValueError(
            f"search algorithm {search_alg!r} is not in nestor; it has {sorted(_NAMES)} (TPE stands in for optuna, "
            "and bayesopt; HyperOptSearch is TPE)"
        ) from None


__all__ = ["Searcher", "BasicVariantGenerator", "OptunaSearch", "TPESearch", "HyperOptSearch", "TuneBOHB", "ConcurrencyLimiter", "Repeater",
           "create_searcher"]
