"""The Python code a sweep calls, served from the driver's own process
while the binary runs (the other side is the binary's ``tuner/src/hooks.rs``).

Three pipes: the binary writes every durable event to the first (JSON
lines), fed to the ``tune.Callback``s on a thread of their own; it writes
requests to the second (a stop after a result, PBT's explore step) and
reads each answer from the third, answered on another thread, so a slow
callback never holds up a stop. A hook that raises is logged with its
traceback and the sweep goes on (a stop that raises counts as "go on", an
explore that raises keeps the built-in step's config).
"""

import json
import os
import random
import sys
import threading
import traceback
from typing import Any, Callable, Dict, List, Optional


def _log_raised(what: str) -> None:
    print(f"nestor: {what} raised (the sweep goes on):\n{traceback.format_exc().rstrip()}", file=sys.stderr, flush=True)


class Explore:
    """PBT's explore step for what the binary cannot do itself: the callable
    ``hyperparam_mutations`` (Ray's rule: resample with
    ``resample_probability``, else a number times one of
    ``perturbation_factors``, else a fresh draw), then ``custom_explore_fn``.
    The draws are seeded by the binary, per perturbation, which also sends
    the scheduler's resolved settings with each request."""

    def __init__(self, callables: Dict[str, Callable[[], Any]], custom: Optional[Callable[[Dict], Dict]]):
        self.callables, self.custom = callables, custom

    def __call__(self, config: Dict[str, Any], seed: int, resample_probability: float, factors: List[float]) -> Dict[str, Any]:
        state = random.getstate()
        random.seed(seed)  # the user's `lambda: random.uniform(...)` draws from this stream too
        try:
            for path, fn in self.callables.items():
                parent, key = _walk(config, path)
                old = parent.get(key)
                if random.random() < resample_probability or not isinstance(old, (int, float)) or isinstance(old, bool):
                    parent[key] = fn()
                else:
                    new = old * random.choice(factors)
                    parent[key] = int(new) if isinstance(old, int) else new
            if self.custom is not None:
                out = self.custom(config)
                if isinstance(out, dict):
                    config = out
        finally:
            random.setstate(state)
        return config


class _Spec(dict):
    """Ray's ``spec`` for a ``sample_from`` function: ``spec.config.x`` and ``spec["config"]["x"]`` alike."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return _Spec(value) if isinstance(value, dict) and not isinstance(value, _Spec) else value


class Sample:
    """Computes a new trial's ``tune.sample_from`` values from the rest of
    its config, in the order they were given, again for those that read a
    value not computed yet; ``random`` (and NumPy's generator, when loaded)
    seeded by the binary per trial."""

    def __init__(self, functions: Dict[str, Callable[..., Any]]):
        self.functions = functions

    def __call__(self, config: Dict[str, Any], seed: int) -> Dict[str, Any]:
        import inspect

        state = random.getstate()
        np = sys.modules.get("numpy")
        np_state = np.random.get_state() if np is not None else None
        random.seed(seed)
        if np is not None:
            np.random.seed(seed % (2 ** 32))
        try:
            todo = list(self.functions.items())
            for _ in range(len(todo) + 1):
                left = []
                for path, fn in todo:
                    try:
                        takes = len(inspect.signature(fn).parameters) > 0
                    except (TypeError, ValueError):
                        takes = True
                    try:
                        value = fn(_Spec({"config": _Spec(config)})) if takes else fn()
                    except (KeyError, AttributeError):
                        left.append((path, fn))
                        continue
                    parent, key = _walk(config, path)
                    parent[key] = value.item() if hasattr(value, "item") and callable(value.item) else value
                if not left or len(left) == len(todo):
                    todo = left
                    break
                todo = left
            if todo:
                path, fn = todo[0]
                fn(_Spec({"config": _Spec(config)}))  # raises its own error, naming what it reads
        finally:
            random.setstate(state)
            if np is not None and np_state is not None:
                np.random.set_state(np_state)
        return config


class DefineByRun:
    """``OptunaSearch(space=fn)``, or over several metrics (a study of as
    many directions, told every metric's last value): Optuna's own study, in the script. Each
    suggestion is a new ``study.ask()`` trial passed to ``fn`` (which calls
    ``trial.suggest_*`` and may return constants); its parameters, with
    ``a/b`` names nested as Ray nests them, are the config. A trial's end
    tells the study its last value of the metric (failed without one).
    After each, the searcher (the study with its sampler's state) is saved
    to ``state_path``, so ``Tuner.restore`` goes on with the same study."""

    def __init__(self, space: Callable[[Any], Any], metrics: List[Optional[str]], modes: List[Optional[str]], sampler: Any,
                 seed: Optional[int]):
        try:
            import optuna
        except ImportError:
            raise ImportError("OptunaSearch(space=fn) and OptunaSearch over several metrics run Optuna itself: "
                              "pip install optuna") from None
        if not metrics or not all(metrics) or any(m not in ("min", "max") for m in modes):
            raise ValueError("OptunaSearch(space=fn) needs a metric and a mode (in it or in TuneConfig)")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space, self.metrics = space, [str(m) for m in metrics]
        self.study = optuna.create_study(directions=["minimize" if m == "min" else "maximize" for m in modes],
                                         sampler=sampler or optuna.samplers.TPESampler(seed=seed))
        #: The study's trial number of each live trial.
        self.live: Dict[str, int] = {}
        self.state_path: Optional[str] = None

    def suggest(self, trial_id: str) -> Dict[str, Any]:
        trial = self.study.ask()
        constants = self.space(trial)
        config: Dict[str, Any] = {}
        for name, value in {**trial.params, **(constants or {})}.items():
            parent, key = _walk(config, name.replace("/", "."))
            parent[key] = value
        self.live[trial_id] = trial.number
        self._save()
        return config

    def complete(self, trial_id: str, result: Optional[Dict[str, Any]], error: bool) -> None:
        import optuna

        number = self.live.pop(trial_id, None)
        if number is None:
            return
        # A study saved before several metrics were possible names one.
        metrics = getattr(self, "metrics", None) or [getattr(self, "metric")]
        values = [(result or {}).get(m) for m in metrics]
        if error or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(number, [float(v) for v in values] if len(values) > 1 else float(values[0]))
        self._save()

    def _save(self) -> None:
        if self.state_path is None:
            return
        import cloudpickle

        tmp = self.state_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(cloudpickle.dumps(self))
        os.replace(tmp, self.state_path)

    @staticmethod
    def saved(experiment_path: str) -> Optional["DefineByRun"]:
        """The searcher a sweep saved, if any."""
        import pickle

        path = os.path.join(experiment_path, "driver", "search.pkl")
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return pickle.load(f)


def _walk(config: Dict[str, Any], path: str):
    parts = path.split("/") if "/" in path else path.split(".")
    node = config
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    return node, parts[-1]


class _Events:
    """Turns the binary's events into Ray's callback hooks."""

    def __init__(self, callbacks: List[Any], experiment_path: str):
        from ._callback import Callback, Trial

        self.callbacks, self.experiment_path, self.Trial = callbacks, experiment_path, Trial
        self.trials: Dict[str, Any] = {}
        #: The trials seen, in order: the list every hook gets (kept, not copied per event).
        self.seen: List[Any] = []
        self.iteration = 0
        # Per hook, the callbacks that define it: a hook nobody overrides costs nothing.
        self.hooks: Dict[str, List[Any]] = {}
        for name in dir(Callback):
            if name.startswith(("on_", "setup")):
                base = getattr(Callback, name)
                self.hooks[name] = [cb for cb in callbacks if getattr(type(cb), name, base) is not base]

    def trial(self, trial_id: str) -> Any:
        t = self.trials.get(trial_id)
        if t is None:
            t = self.trials[trial_id] = self.Trial(trial_id, self.experiment_path)
            self.seen.append(t)
        return t

    def _update(self, t: Any, ev: Dict[str, Any]) -> None:
        if isinstance(ev.get("config"), dict):
            t.config = ev["config"]
        if ev.get("status"):
            t.status = ev["status"]
        if ev.get("error"):
            t.error = ev["error"]
        t.num_failures = ev.get("failures", t.num_failures)

    def call(self, name: str, *args: Any, **kwargs: Any) -> None:
        for cb in self.hooks.get(name, ()):
            try:
                getattr(cb, name)(*args, **kwargs)
            except Exception:
                _log_raised(f"callback {type(cb).__name__}.{name}")

    def handle(self, ev: Dict[str, Any]) -> None:
        kind = ev.get("event")
        self.iteration += 1
        trials = self.seen
        it = self.iteration
        if kind == "experiment_started":
            self.call("setup", stop=None, num_samples=ev.get("planned"), total_num_samples=ev.get("planned"))
        elif kind == "status":
            self.call("on_step_begin", iteration=it, trials=trials)
            self.call("on_step_end", iteration=it, trials=trials)
        elif kind == "trial_started":
            t = self.trial(ev["trial_id"])
            self._update(t, ev)
            t.status = "RUNNING"
            again = ev.get("resumed") or ev.get("restarts") or ev.get("exploits")
            self.call("on_trial_restore" if again else "on_trial_start", iteration=it, trials=trials, trial=t)
        elif kind == "result":
            t = self.trial(ev["trial_id"])
            t.last_result = ev["result"]
            self.call("on_trial_result", iteration=it, trials=trials, trial=t, result=ev["result"])
        elif kind == "checkpoint_committed":
            t = self.trial(ev["trial_id"])
            t.checkpoint_uri = ev["uri"]
            self.call("on_trial_save", iteration=it, trials=trials, trial=t)
            if self.hooks.get("on_checkpoint"):
                self.call("on_checkpoint", iteration=it, trials=trials, trial=t, checkpoint=t.checkpoint)
        elif kind in ("trial_completed", "trial_errored", "trial_paused", "trial_interrupted"):
            t = self.trial(ev["trial_id"])
            self._update(t, ev)
            if kind == "trial_completed":
                self.call("on_trial_complete", iteration=it, trials=trials, trial=t)
            elif kind == "trial_errored":
                self.call("on_trial_error", iteration=it, trials=trials, trial=t)
        elif kind == "trial_restarted":
            t = self.trial(ev["trial_id"])
            t.num_failures += 1
            self.call("on_trial_recover", iteration=it, trials=trials, trial=t)
        elif kind == "experiment_ended":
            self.call("on_experiment_end", trials=trials)


class HookServer:
    """Serves a sweep's Python hooks while the binary runs."""

    def __init__(self, experiment_path: str, callbacks: List[Any], stop: Optional[Any], explore: Optional[Explore],
                 sample: Optional[Sample] = None, search: Optional[DefineByRun] = None):
        self.events = _Events(callbacks, experiment_path)
        self.stop, self.explore, self.sample, self.search = stop, explore, sample, search
        if search is not None:
            search.state_path = os.path.join(experiment_path, "driver", "search.pkl")
        self._ev_r, self._ev_w = os.pipe()
        self._rq_r, self._rq_w = os.pipe()
        self._rs_r, self._rs_w = os.pipe()
        self._threads: List[threading.Thread] = []

    def child_fds(self) -> List[int]:
        """The ends the binary keeps (``pass_fds``)."""
        return [self._ev_w, self._rq_w, self._rs_r]

    def all_fds(self) -> List[int]:
        """Both ends of its pipes (what a process forked from this one must close)."""
        return [self._ev_r, self._ev_w, self._rq_r, self._rq_w, self._rs_r, self._rs_w]

    def env(self) -> Dict[str, str]:
        return {"NESTOR_HOOKS": f"{self._ev_w},{self._rq_w},{self._rs_r}"}

    def start(self) -> None:
        """After the binary started: our copies of its ends closed (so its exit is our end of file), the threads up."""
        for fd in self.child_fds():
            os.close(fd)
        for target, name in ((self._serve_events, "nestor-callbacks"), (self._serve_requests, "nestor-hooks")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def finish(self, timeout: Optional[float] = None) -> None:
        """Waits (at most ``timeout``: the callbacks' deadline, ``NESTOR_CALLBACK_DEADLINE_S``
        or 30 s) for the callbacks to take the last events."""
        if timeout is None:
            timeout = float(os.environ.get("NESTOR_CALLBACK_DEADLINE_S") or 30)
        for t in self._threads:
            t.join(timeout=timeout)

    def _serve_events(self) -> None:
        with os.fdopen(self._ev_r, "rb") as f:
            for raw in f:
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                self.events.handle(ev)

    def _serve_requests(self) -> None:
        with os.fdopen(self._rq_r, "rb") as requests, os.fdopen(self._rs_w, "wb") as replies:
            for raw in requests:
                try:
                    answer = self._answer(json.loads(raw))
                except Exception as e:
                    answer = {"error": f"{type(e).__name__}: {e}"}
                try:
                    replies.write((json.dumps(answer) + "\n").encode())
                    replies.flush()
                except (BrokenPipeError, ValueError):
                    return

    def _answer(self, req: Dict[str, Any]) -> Dict[str, Any]:
        hook = req.get("hook")
        if hook == "stop":
            if self.stop is None:
                return {"stop": False}
            try:
                stop = bool(self.stop(req["trial_id"], req["result"]))
                stop_all = bool(self.stop.stop_all()) if hasattr(self.stop, "stop_all") else False
            except Exception:
                _log_raised("the stop function")
                raise
            return {"stop": stop, "stop_all": stop_all}
        if hook == "explore":
            if self.explore is None:
                return {"config": req["config"]}
            try:
                return {"config": self.explore(req["config"], int(req["seed"]), float(req["resample_probability"]),
                                               [float(f) for f in req["perturbation_factors"]])}
            except Exception:
                _log_raised("PBT's explore step")
                raise
        if hook == "suggest" and self.search is not None:
            try:
                return {"config": self.search.suggest(req["trial_id"])}
            except Exception:
                _log_raised("the define-by-run search space")
                raise
        if hook == "complete" and self.search is not None:
            self.search.complete(req["trial_id"], req.get("result"), bool(req.get("error")))
            return {}
        if hook == "sample":
            if self.sample is None:
                return {"config": req["config"]}
            try:
                return {"config": self.sample(req["config"], int(req["seed"]))}
            except Exception:
                _log_raised("a tune.sample_from function")
                raise
        return {"error": f"unknown hook {hook!r}"}
