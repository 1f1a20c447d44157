"""Ray Tune's API for nestor (``ray.tune``): search spaces, ``Tuner``,
``TuneConfig``, schedulers and searchers under Ray's names, and
``report``/``get_checkpoint``/``get_context`` for function trainables.

``Tuner.fit()`` writes the experiment the binary runs (the same one a TOML
file describes), pickles the trainable by value, runs ``nestor run`` and
returns the ``ResultGrid`` read from the experiment's store."""

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from .. import _driver
from .._results import Result, ResultGrid, TrainingFailedError
from ..train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ..train import get_checkpoint, get_context, report
from .._checkpoint import Checkpoint
from . import schedulers, search
from .._resources import PlacementGroupFactory, as_resources
from . import stopper
from .._callback import Callback
from .stopper import Stopper
from .._trainable import Trainable
from ._space import (
    Domain, choice, grid_search, lograndint, loguniform, qlograndint, qloguniform, qrandint, qrandn, quniform,
    randint, randn, sample_from, to_space, uniform,
)

TuneError = _driver.TuneError
from .progress_reporter import CLIReporter, JupyterNotebookReporter, ProgressReporter  # noqa: E402
from ..train import SyncConfig  # noqa: E402


@dataclass
class ResumeConfig:
    """Ray's ``tune.ResumeConfig`` for ``Tuner.restore(..., resume_config=...)``:
    unfinished trials always go on (from their latest checkpoint); errored
    ones are resumed (``errored=RESUME``) or restarted (``RESTART``) or left."""

    class ResumeType:
        RESUME = "resume"
        RESTART = "restart"
        SKIP = "skip"

    finished: str = "skip"
    unfinished: str = "resume"
    errored: str = "skip"


@dataclass
class TuneConfig:
    """How the sweep searches (Ray's names)."""

    metric: Optional[str] = None
    mode: Optional[str] = None
    search_alg: Optional[search.Searcher] = None
    scheduler: Optional[schedulers.TrialScheduler] = None
    num_samples: int = 1
    max_concurrent_trials: Optional[int] = None
    time_budget_s: Optional[float] = None
    reuse_actors: Optional[bool] = None
    trial_name_creator: Optional[Callable[..., str]] = None
    trial_dirname_creator: Optional[Callable[..., str]] = None
    seed: Optional[int] = None

    def __post_init__(self) -> None:
        if self.mode not in (None, "min", "max"):
            raise ValueError(f"TuneConfig(mode={self.mode!r}): mode must be 'min' or 'max'")
        if self.num_samples == -1:
            raise ValueError("TuneConfig(num_samples=-1): give a number of samples (and time_budget_s to bound the time)")
        if self.reuse_actors:
            print("nestor: TuneConfig(reuse_actors=...) is ignored: every rank is a fresh fork of a warm process "
                  "(docs/python.md)", file=sys.stderr)
        if self.trial_name_creator or self.trial_dirname_creator:
            print("nestor: TuneConfig(trial_name_creator/trial_dirname_creator) is ignored: trials are named trial_00000, ...",
                  file=sys.stderr)


class _WithParameters:
    """A function trainable with large or unpicklable-by-config objects bound (``tune.with_parameters``)."""

    def __init__(self, fn: Callable[..., Any], kwargs: Dict[str, Any]):
        self.fn, self.kwargs = fn, kwargs
        self.__name__ = getattr(fn, "__name__", "trainable")

    def __call__(self, config: Dict[str, Any]) -> Any:
        return self.fn(config, **self.kwargs)


def with_parameters(trainable: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
    """``trainable`` called as ``trainable(config, **kwargs)``; the objects
    travel pickled with the function, once per experiment."""
    return _WithParameters(trainable, kwargs)


class _WithResources(_WithParameters):
    def __init__(self, fn: Callable[..., Any], resources: Dict[str, float]):
        super().__init__(fn, {})
        self.resources = resources

    def __call__(self, config: Dict[str, Any]) -> Any:
        from .._worker import call

        return call(self.fn, config)


def with_resources(trainable: Callable[..., Any], resources: Any) -> Callable[..., Any]:
    """``trainable`` with the resources each trial needs (``{"cpu": 2, "gpu": 1}``, or a
    ``PlacementGroupFactory``, whose bundles a trial gets in all)."""
    if callable(resources) and not isinstance(resources, Mapping):
        raise ValueError("tune.with_resources: give a dict of resources; a function of the config is not supported")
    return _WithResources(trainable, as_resources(resources) or {})


def _split(trainable: Any) -> Dict[str, Any]:
    """What the binary runs for ``trainable``: the blob, the trainer table and the trainable's own run config."""
    # A trainer (nestor.train's, which builds on this package) says what it runs itself.
    if callable(getattr(trainable, "_parts", None)) and hasattr(trainable, "train_loop_per_worker"):
        return trainable._parts()
    # Unwrap with_resources / with_parameters (in either order) down to the function or class.
    resources: Optional[Dict[str, float]] = None
    kwargs: Dict[str, Any] = {}
    inner = trainable
    while isinstance(inner, _WithParameters):
        if isinstance(inner, _WithResources):
            resources = resources or inner.resources
        else:
            kwargs = {**inner.kwargs, **kwargs}
        inner = inner.fn
    scaling = ScalingConfig()
    if resources:
        scaling.resources_per_worker = resources
        scaling.use_gpu = any(k.lower() == "gpu" and v for k, v in resources.items())
    if isinstance(inner, type):
        if not issubclass(inner, Trainable):
            raise TypeError(f"Tuner: {inner.__name__} is a class but not a tune.Trainable subclass; give a function "
                            "`def train(config): ... tune.report(metrics)` or subclass tune.Trainable")
        if resources is None and inner.default_resource_request.__func__ is not Trainable.default_resource_request.__func__:
            print(f"nestor: {inner.__name__}.default_resource_request is not called: give the trial's resources with "
                  "tune.with_resources(trainable, {...}) (each trial gets 1 CPU otherwise)", file=sys.stderr)
        blob = {"kind": "class", "cls": inner, "kwargs": kwargs}
        return {"blob": blob, "scaling": scaling, "run_config": None, "train_loop_config": None}
    if not callable(trainable):
        raise TypeError(f"Tuner: trainable must be a function, a tune.Trainable subclass or a TorchTrainer, "
                        f"not {type(trainable).__name__}")
    return {"blob": {"kind": "function", "fn": trainable}, "scaling": scaling, "run_config": None, "train_loop_config": None}


class Tuner:
    """A sweep over ``param_space`` of a function or a ``TorchTrainer``."""

    def __init__(self, trainable: Any = None, *, param_space: Optional[Dict[str, Any]] = None,
                 tune_config: Optional[TuneConfig] = None, run_config: Optional[RunConfig] = None,
                 _restore_path: Optional[str] = None):
        self._trainable = trainable
        self._param_space = dict(param_space or {})
        self._tune_config = tune_config or TuneConfig()
        self._restore_path = _restore_path
        self._errored: List[str] = []
        parts = _split(trainable)
        self._parts = parts
        self._run_config = run_config or parts["run_config"] or RunConfig()
        self._workers_from: Optional[str] = None
        scaling = self._param_space.get("scaling_config")
        if isinstance(scaling, ScalingConfig):
            self._param_space = dict(self._param_space)
            self._param_space["scaling_config"] = self._scaling_in_space(scaling)
        self._sampled: Dict[str, Callable[..., Any]] = {}
        self._space = to_space(self._param_space, sampled=self._sampled)

    def _scaling_in_space(self, scaling: ScalingConfig) -> Dict[str, Any]:
        """A ``ScalingConfig`` in ``param_space`` (Ray's Train + Tune pattern):
        its fixed fields replace the trainer's, a domain for ``num_workers``
        gives each trial its own number of workers (the binary reads it from
        the trial's config)."""
        import dataclasses

        base = self._parts["scaling"]
        fields = {f.name: getattr(scaling, f.name) for f in dataclasses.fields(scaling)}
        defaults = {f.name: f.default for f in dataclasses.fields(scaling)}
        merged = {k: (v if v != defaults[k] else getattr(base, k)) for k, v in fields.items()}
        for k, v in merged.items():
            if k != "num_workers" and isinstance(v, Domain):
                raise ValueError(f"param_space['scaling_config'].{k}: only num_workers may vary between trials")
        workers = fields["num_workers"]
        if isinstance(workers, Domain):
            self._workers_from = "scaling_config.num_workers"
            merged["num_workers"] = 1
        self._parts = {**self._parts, "scaling": ScalingConfig(**merged)}
        return {"num_workers": workers} if isinstance(workers, Domain) else {"num_workers": int(workers)}

    @classmethod
    def restore(cls, path: str, trainable: Any, resume_unfinished: bool = True, resume_errored: bool = False,
                restart_errored: bool = False, param_space: Optional[Dict[str, Any]] = None,
                resume_config: Optional[ResumeConfig] = None, **_ignored: Any) -> "Tuner":
        """The interrupted or crashed experiment at ``path``, to continue
        with ``fit()``: finished trials are kept, unfinished ones go on from
        their latest committed checkpoint, the search continues where it was.
        ``trainable`` is the same function (pass it again, as in Ray)."""
        if resume_config is not None:
            if resume_config.unfinished != ResumeConfig.ResumeType.RESUME or resume_config.finished != ResumeConfig.ResumeType.SKIP:
                raise ValueError("Tuner.restore(resume_config=...): nestor resumes unfinished trials and keeps finished ones; "
                                 "only errored= may change")
            resume_errored = resume_config.errored == ResumeConfig.ResumeType.RESUME
            restart_errored = resume_config.errored == ResumeConfig.ResumeType.RESTART
        path = os.fspath(path)
        if not _driver.is_url(path):
            path = os.path.abspath(os.path.expanduser(path))
        if not resume_unfinished:
            raise ValueError("Tuner.restore(resume_unfinished=False) is not supported: unfinished trials always resume")
        if resume_errored and restart_errored:
            raise ValueError("Tuner.restore: give resume_errored or restart_errored, not both")
        if _driver.is_url(path):
            # An experiment whose storage is an object store: brought back from the bucket alone.
            path = _driver.pull(path)
        if not cls.can_restore(path):
            raise ValueError(f"Tuner.restore: {path} is not a nestor experiment (no store/ and experiment.toml in it)")
        if param_space is not None:
            print("nestor: Tuner.restore(param_space=...) is ignored: the restored sweep keeps its space (its "
                  "configs are in the store)", file=sys.stderr)
        tuner = cls(trainable, _restore_path=path)
        tuner._errored = ["--resume-errored"] if resume_errored else ["--restart-errored"] if restart_errored else []
        return tuner

    @staticmethod
    def can_restore(path: str) -> bool:
        """Whether ``path`` holds an experiment that ``Tuner.restore`` can continue
        (a directory, or the URL of one whose storage is an object store)."""
        if _driver.is_url(path):
            import subprocess

            from .. import _binary

            return subprocess.run([_binary.find(), "status", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        return os.path.isdir(os.path.join(path, "store")) and os.path.isfile(os.path.join(path, "experiment.toml"))

    def _experiment(self, name: str, blob_path: str, exp_dir: str) -> Dict[str, Any]:
        tc, rc, parts = self._tune_config, self._run_config, self._parts
        sched, alg = tc.scheduler, tc.search_alg
        metric = tc.metric or (sched.metric if sched else None) or (alg.metric if alg else None)
        mode = tc.mode or (sched.mode if sched else None) or (alg.mode if alg else None)
        if metric is not None and not isinstance(metric, str) or mode is not None and not isinstance(mode, str):
            raise ValueError(f"TuneConfig: metric={metric!r}, mode={mode!r}: the sweep goes by one metric and mode; "
                             "several are a multi-objective search: OptunaSearch(metric=[...], mode=[...])")
        experiment: Dict[str, Any] = {"name": name, "num_samples": int(tc.num_samples)}
        if metric:
            experiment["metric"] = metric
        if mode:
            experiment["mode"] = mode
        if tc.max_concurrent_trials:
            experiment["max_concurrent_trials"] = int(tc.max_concurrent_trials)
        if tc.time_budget_s:
            experiment["time_budget_s"] = float(tc.time_budget_s)
        # A searcher's own seed, through a ConcurrencyLimiter or Repeater too.
        seed = tc.seed if tc.seed is not None else getattr(getattr(alg, "searcher", alg), "seed", None) if alg is not None else None
        if seed is not None:
            experiment["seed"] = int(seed)
        if rc.storage_path:
            experiment["storage"] = rc.storage_path
        if rc.failure_config and rc.failure_config.fail_fast:
            experiment["fail_fast"] = True
        from .._settings import _log_to_driver

        if not _log_to_driver:
            experiment["log_to_driver"] = False
        trainer: Dict[str, Any] = {"command": [sys.executable, "-m", "nestor._worker", blob_path], "working_dir": os.getcwd(),
                                   "warm": os.environ.get("NESTOR_WARM", "1") != "0", "files": [blob_path]}
        trainer.update(parts["scaling"]._trainer())
        if self._workers_from:
            trainer["num_workers_from"] = self._workers_from
        trainer.update(parts.get("trainer_extra") or {})
        env = _driver.worker_env()
        env["NESTOR_EXPERIMENT_NAME"] = name
        env["NESTOR_STORAGE_PATH"] = os.path.expanduser(rc.storage_path) if rc.storage_path else os.path.dirname(exp_dir)
        # What a trainer's framework needs in its ranks' environment from the start (TensorFlow's Keras switch).
        env.update(parts.get("env") or {})
        trainer["env"] = env
        doc: Dict[str, Any] = {"experiment": experiment, "space": self._space}
        from .._settings import _cluster, _declared_resources

        if _cluster is not None:
            # init(cluster=SlurmJobs(...)): each trial run a Slurm job of its own.
            doc["cluster"] = _cluster

        if _declared_resources:
            # ray.init(num_cpus=, num_gpus=, resources=): the pool the sweep schedules on.
            doc["resources"] = dict(_declared_resources)
        if alg is not None:
            doc["search"] = alg._table()
        if sched is not None:
            doc["scheduler"] = sched._table()
        if isinstance(rc.stop, dict) and rc.stop:
            doc["stop"] = {k: float(v) for k, v in rc.stop.items()}
        doc["trainer"] = trainer
        tables = [t for t in (c._table() for c in rc.callbacks or [] if hasattr(c, "_table")) if t]
        if tables:
            doc["callbacks"] = tables
        hooks = self._hooks()
        python: Dict[str, Any] = {}
        if hooks["callbacks"]:
            python["callbacks"] = [type(c).__name__ for c in hooks["callbacks"]]
            from ..train import UserCallback

            if any(isinstance(c, UserCallback) for c in hooks["callbacks"]):
                # Ray Train's UserCallback is given every rank's metrics of each report.
                python["rank_metrics"] = True
        if hooks["stop"] is not None:
            python["stop"] = True
        if hooks["explore"] is not None:
            python["explore"] = True
        if hooks["sample"] is not None:
            python["sample"] = True
        if hooks["search"] is not None:
            python["search"] = True
        if python:
            if hooks["callbacks"] and os.environ.get("NESTOR_CALLBACK_DEADLINE_S"):
                python["callback_deadline_s"] = float(os.environ["NESTOR_CALLBACK_DEADLINE_S"])
            doc["python"] = python
        checkpoint = rc.checkpoint_config._table() if rc.checkpoint_config else {}
        # Every iteration when the scheduler pauses trials (the binary knows which do); Ray's functions save when they like.
        checkpoint.setdefault("frequency", "auto")
        if checkpoint:
            doc["checkpoint"] = checkpoint
        fc = rc.failure_config
        failure = {}
        if fc and fc.max_failures:
            failure["max_failures"] = int(fc.max_failures)
        if fc and getattr(fc, "max_infrastructure_failures", None) is not None:
            failure["max_infrastructure_failures"] = int(fc.max_infrastructure_failures)
        if failure:
            doc["failure"] = failure
        return doc

    def _hooks(self) -> Dict[str, Any]:
        """The Python code the binary calls: callbacks, a stop function or Stopper, PBT's explore step,
        ``sample_from`` functions, a define-by-run search (made once)."""
        if getattr(self, "_hooks_made", None) is None:
            self._hooks_made = self._make_hooks()
        return self._hooks_made

    def _make_hooks(self) -> Dict[str, Any]:
        rc, sched = self._run_config, self._tune_config.scheduler
        callbacks = [c for c in rc.callbacks or [] if not hasattr(c, "_table")]
        stop = rc.stop if rc.stop is not None and not isinstance(rc.stop, dict) else None
        if stop is not None and not hasattr(stop, "stop_all"):
            from .stopper import FunctionStopper

            stop = FunctionStopper(stop)
        base = getattr(sched, "_base", sched)
        explore = base._explore() if hasattr(base, "_explore") else None
        sample = None
        if self._sampled:
            from .._hooks import Sample

            sample = Sample(self._sampled)
        tc = self._tune_config
        alg = tc.search_alg
        inner = getattr(alg, "searcher", alg)  # through a ConcurrencyLimiter or Repeater
        search = inner._python(tc.metric, tc.mode, tc.seed, self._param_space) if hasattr(inner, "_python") else None
        return {"callbacks": callbacks, "stop": stop, "explore": explore, "sample": sample, "search": search}

    def _run_settings(self) -> Dict[str, Any]:
        """What a class trainable's runs need of the run config (kept for ``Tuner.restore``)."""
        rc = self._run_config
        cc = rc.checkpoint_config
        at_end = bool(cc and cc.checkpoint_at_end)
        if self._parts["blob"].get("kind") != "class":
            if at_end:
                print("nestor: CheckpointConfig(checkpoint_at_end=True) is ignored for a function trainable: it saves "
                      "its checkpoints itself with report(..., checkpoint=...)", file=sys.stderr)
            return {}
        return {"stop": {k: float(v) for k, v in (rc.stop or {}).items()}, "checkpoint_at_end": at_end}

    def fit(self) -> ResultGrid:
        """Runs the sweep (or continues a restored one) and returns every trial's result."""
        tc = self._tune_config
        if self._restore_path:
            exp_dir = self._restore_path
            blob = _driver.write_blob(exp_dir, {**_plan_datasets(self._parts["blob"], exp_dir), **_driver.read_run_settings(exp_dir)})
            hooks = _driver.read_hooks(exp_dir)
            if hooks and hooks.get("search") is not None:
                from .._hooks import DefineByRun

                # The define-by-run study as it was last saved (every trial it suggested and was told of).
                hooks["search"] = DefineByRun.saved(exp_dir) or hooks["search"]
            # This machine's Python, working directory and module path: the sweep may go on elsewhere than it began.
            here = {"trainer.command": [sys.executable, "-m", "nestor._worker", blob], "trainer.working_dir": os.getcwd(),
                    "trainer.files": [blob], **{f"trainer.env.{k}": v for k, v in _driver.worker_env().items()}}
            sets = [a for k, v in here.items() for a in ("--set", f"{k}={json.dumps(v)}")]
            try:
                _driver.run_binary(["resume", exp_dir, *self._errored, *sets], hooks=_serve(exp_dir, hooks), warm=blob)
            except _driver.FailFast:
                pass  # the restored sweep stopped at its first failure: its grid, as Ray's fail_fast=True
        else:
            rc = self._run_config
            name = rc.name or _driver.default_name(self._trainable, rc.storage_path)
            exp_dir = _driver.experiment_dirs(rc.storage_path, name)
            if os.path.exists(os.path.join(exp_dir, "store")):
                raise ValueError(f"experiment directory {exp_dir} already exists; continue it with Tuner.restore({exp_dir!r}, "
                                 "trainable) or pick another RunConfig(name=...)")
            settings = self._run_settings()
            planned = _plan_datasets(self._parts["blob"], exp_dir)
            _driver.write_run_settings(exp_dir, settings)
            blob = _driver.write_blob(exp_dir, {**planned, **settings})
            sweep = _driver.write_experiment(exp_dir, self._experiment(name, blob, exp_dir))
            hooks = self._hooks()
            if any(v for v in hooks.values()):
                _driver.write_hooks(exp_dir, hooks)
            try:
                _driver.run_binary(["run", sweep], hooks=_serve(exp_dir, hooks), warm=blob)
            except _driver.FailFast:
                # Ray's fail_fast=True stops the other trials and returns the grid (the error in
                # its results); fail_fast="raise" raises the failure.
                fail_fast = rc.failure_config.fail_fast if rc.failure_config else False
                if isinstance(fail_fast, str) and fail_fast.lower() == "raise":
                    raise
        metric = tc.metric or (tc.scheduler.metric if tc.scheduler else None)
        mode = tc.mode or (tc.scheduler.mode if tc.scheduler else None)
        return ResultGrid(exp_dir, metric, mode)

    def get_results(self) -> ResultGrid:
        """The results of a restored (or finished) experiment, without running it."""
        if not self._restore_path:
            raise RuntimeError("Tuner.get_results: call fit() first, or use it on a Tuner from Tuner.restore")
        return ResultGrid(self._restore_path)


def _plan_datasets(blob: Dict[str, Any], exp_dir: str) -> Dict[str, Any]:
    """The blob with its data sets checked and planned (a trainer's
    ``datasets=``: in-memory ones written once under ``driver/datasets``),
    before any trial runs: a missing or unreadable file is a ``ValueError``."""
    plan = blob.get("datasets")
    if not callable(plan):
        return blob
    return {**blob, "datasets": plan(os.path.join(exp_dir, "driver", "datasets"))}


def _serve(exp_dir: str, hooks: Optional[Dict[str, Any]]) -> Any:
    """The server of the sweep's Python hooks, or None when it has none."""
    if not hooks or not any(hooks.get(k) for k in ("callbacks", "stop", "explore", "sample", "search")):
        return None
    from .._hooks import HookServer

    return HookServer(exp_dir, list(hooks.get("callbacks") or []), hooks.get("stop"), hooks.get("explore"), hooks.get("sample"),
                      hooks.get("search"))


def run(*_a: Any, **_k: Any) -> Any:
    raise NotImplementedError("tune.run was replaced by tune.Tuner(...).fit() in Ray 2.0; nestor has only Tuner")


__all__ = [
    "CLIReporter", "JupyterNotebookReporter", "ProgressReporter", "ResumeConfig", "SyncConfig", "Callback", "Checkpoint", "CheckpointConfig", "Domain", "Stopper", "FailureConfig", "Result", "ResultGrid", "RunConfig", "ScalingConfig",
    "PlacementGroupFactory", "Trainable", "TrainingFailedError", "TuneConfig", "TuneError", "Tuner", "choice", "get_checkpoint", "get_context", "grid_search",
    "lograndint", "loguniform", "qlograndint", "qloguniform", "qrandint", "qrandn", "quniform", "randint", "randn",
    "report", "sample_from", "schedulers", "search", "uniform", "with_parameters", "with_resources",
]
