"""Every public name of Ray Tune, Ray Train, Ray AIR and Ray Data's training
surface answers under nestor's same path: nestor's own object, or a
stand-in that says, when used, that nestor does not have it and why.

``_ray_api.json`` lists Ray's public names by module (written from Ray
2.60's source by ``python/checks/ray_api.py``). An import finder, put in
place when ``nestor`` is imported, does two things for the modules of
``nestor.tune``, ``nestor.train``, ``nestor.air`` and ``nestor.data``:

- a module Ray has and nestor has no file for (``ray.train.horovod``,
  ``ray.tune.search.ax``) is made on import; each of its names is the same
  name of the nearest nestor package above it (``ray.air.config.RunConfig``
  is ``nestor.air.RunConfig``), else a :class:`Refused` stand-in;
- a module nestor has gets the same fallback for the Ray names it lacks,
  so ``from nestor.tune import CLIReporter`` imports, and using it says
  what nestor does instead.

A name Ray does not have is an ``AttributeError`` as usual: a typo is
never taken for a refused name.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Set

#: Why nestor lacks what it lacks, by Ray module (the longest prefix applies).
REASONS: Dict[str, str] = {
    "ray.tune": "nestor does not have it",
    "ray.train": "nestor does not have it",
    "ray.air": "nestor does not have it",
    "ray.data": "nestor's data sets have the reads, transforms and iterators a training script uses (docs/data.md); not this",
    "ray.train.horovod": "Horovod is not in nestor: TorchTrainer runs the same data-parallel training on torch.distributed",
    "ray.train.torch.xla": "XLA devices (TPUs) are not supported by nestor",
    "ray.train.v2.jax": "JAX is not supported by nestor",
    "ray.tune.search.ax": "Ax is not among nestor's searchers (random, grid, TPE, BOHB, HyperOptSearch, OptunaSearch)",
    "ray.tune.search.bayesopt": "BayesOpt is not among nestor's searchers (random, grid, TPE, BOHB, HyperOptSearch, OptunaSearch)",
    "ray.tune.search.hebo": "HEBO is not among nestor's searchers (random, grid, TPE, BOHB, HyperOptSearch, OptunaSearch)",
    "ray.tune.search.nevergrad": "Nevergrad is not among nestor's searchers (random, grid, TPE, BOHB, HyperOptSearch, OptunaSearch)",
    "ray.tune.search.zoopt": "ZOOpt is not among nestor's searchers (random, grid, TPE, BOHB, HyperOptSearch, OptunaSearch)",
    "ray.tune.progress_reporter": "nestor prints its own live trial table; a reporter is not needed (verbose=0 quiets it)",
    "ray.tune.registry": "nestor has no registry of trainables: pass the trainable itself to Tuner",
    "ray.tune.logger.aim": "Aim is not among nestor's loggers (TensorBoard, CSV, JSON, MLflow, W&B)",
    "ray.air.integrations.comet": "Comet is not among nestor's loggers (TensorBoard, CSV, JSON, MLflow, W&B)",
    "ray.tune.syncer": "nestor writes results straight to storage_path (a directory or a bucket): there is nothing to sync",
    "ray.train.torch.train_loop_utils.TorchWorkerProfiler": "nestor has no worker profiler: use torch.profiler in the training function",
    "ray.tune.tune": "tune.run was replaced by tune.Tuner(...).fit() in Ray 2.0; nestor has only Tuner",
    "ray.data.preprocessors": "this preprocessor is not among nestor's (docs/data.md lists them); write the transform with map_batches",
}


class Refused:
    """A Ray name nestor does not have: importing it works (a script may
    import more than it uses); calling it, reading from it or subclassing
    it raises ``NotImplementedError`` naming it and saying why."""

    def __init__(self, full: str, reason: str):
        object.__setattr__(self, "_full", full)
        object.__setattr__(self, "_reason", reason)

    def _refuse(self) -> NotImplementedError:
        return NotImplementedError(f"{self._full} is not in nestor: {self._reason}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise self._refuse()

    def __mro_entries__(self, bases: Any) -> Any:
        raise self._refuse()

    def __repr__(self) -> str:
        return f"<{self._full}: not in nestor>"


_table: Optional[Dict[str, Set[str]]] = None


def table() -> Dict[str, Set[str]]:
    """Ray's public names by module (``ray.x.y`` -> names)."""
    global _table
    if _table is None:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ray_api.json"), encoding="utf-8") as f:
            _table = {k: set(v) for k, v in json.load(f).items()}
    return _table


_ROOTS = ("nestor.tune", "nestor.train", "nestor.air", "nestor.data")


def _ray(module: str) -> str:
    return "ray" + module[len("nestor"):]


def reason(full: str) -> str:
    """Why nestor lacks ``full`` (a ``ray.`` module or name)."""
    best = max((k for k in REASONS if full == k or full.startswith(k + ".")), key=len, default="")
    return REASONS.get(best, "nestor does not have it")


def resolve(module: str, name: str) -> Any:
    """``name`` of the nestor module ``module``, which lacks it: the same
    name of the nearest nestor package above it, or a ``Refused`` stand-in;
    ``AttributeError`` when Ray has no such name there either."""
    ray_module = _ray(module)
    if name not in table().get(ray_module, ()):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    parts = module.split(".")
    while len(parts) > 2:
        parts.pop()
        parent = ".".join(parts)
        try:
            value = getattr(importlib.import_module(parent), name)
        except (ImportError, AttributeError):
            continue
        if not isinstance(value, Refused):
            return value
    full = f"{ray_module}.{name}"
    return Refused(full, reason(full))


def _fallback(module: types.ModuleType) -> None:
    """Gives a nestor module the Ray names it lacks (keeping its own ``__getattr__`` first)."""
    own: Optional[Callable[[str], Any]] = module.__dict__.get("__getattr__")
    name_of = module.__name__

    def __getattr__(name: str) -> Any:
        if own is not None:
            try:
                return own(name)
            except AttributeError:
                pass
        if name.startswith("__"):
            raise AttributeError(f"module {name_of!r} has no attribute {name!r}")
        return resolve(name_of, name)

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]


def _children(ray_module: str) -> List[str]:
    prefix = ray_module + "."
    return [m for m in table() if m.startswith(prefix)]


class _Loader(importlib.abc.Loader):
    """Runs nestor's own module (when there is one), then adds the fallback."""

    def __init__(self, inner: Optional[importlib.abc.Loader]):
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        return self.inner.create_module(spec) if self.inner is not None else None

    def exec_module(self, module: types.ModuleType) -> None:
        if self.inner is not None:
            self.inner.exec_module(module)  # type: ignore[attr-defined]
        else:
            ray_module = _ray(module.__name__)
            module.__doc__ = f"Ray's module path ``{ray_module}``: {reason(ray_module)}."
            module.__all__ = sorted(table().get(ray_module, ()))  # type: ignore[attr-defined]
        if not hasattr(module, "__path__") and _children(_ray(module.__name__)):
            # A file of nestor's where Ray has a package (nestor/train/torch.py, ray/train/torch/):
            # its Ray submodules (ray.train.torch.config) are made by the finder.
            module.__path__ = []  # type: ignore[attr-defined]
        _fallback(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(_ROOTS) or fullname.split(".")[1] not in ("tune", "train", "air", "data"):
            return None
        ray_module = _ray(fullname)
        known = ray_module in table() or bool(_children(ray_module))
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None:
            if known and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
            return spec
        if not known:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _Loader(None), is_package=bool(_children(ray_module)))
        if spec.submodule_search_locations is not None:
            spec.submodule_search_locations[:] = []
        return spec


def install() -> None:
    """Puts the finder first (once): nestor's own files are still found by
    the usual path finder, through it."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
