"""Ray Tune's helpers (``ray.tune.utils``): nested-dict handling for
configs and results, a check that a class trainable saves and restores,
a look at what cannot be pickled in a trainable, and waiting for a GPU
to be free before a trial uses it."""

import copy
import datetime
import os
import shutil
import subprocess
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Union

__all__ = [
    "date_str",
    "deep_update",
    "diagnose_serialization",
    "flatten_dict",
    "merge_dicts",
    "unflatten_dict",
    "unflattened_lookup",
    "validate_save_restore",
    "wait_for_gpu",
]


def date_str() -> str:
    """Now, as Tune names experiment directories: ``2026-11-27_14-05-09``."""
    return datetime.datetime.today().strftime("%Y-%m-%d_%H-%M-%S")


def flatten_dict(dt: Mapping[str, Any], delimiter: str = "/", prevent_delimiter: bool = False,
                 flatten_list: bool = False) -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a/b": 1}`` (a new dict). ``prevent_delimiter``:
    a key holding the delimiter is an error; ``flatten_list``: lists and
    tuples of dicts are flattened too, their items keyed by index."""
    out: Dict[str, Any] = {}

    def visit(value: Any, prefix: str) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                key = str(k)
                if prevent_delimiter and delimiter in key:
                    raise ValueError(f"Found delimiter `{delimiter}` in key `{key}` when trying to flatten the dict")
                visit(v, f"{prefix}{delimiter}{key}" if prefix else key)
        elif flatten_list and isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value):
            for i, v in enumerate(value):
                visit(v, f"{prefix}{delimiter}{i}" if prefix else str(i))
        else:
            out[prefix] = value

    if not isinstance(dt, Mapping):
        raise TypeError(f"flatten_dict takes a dict, not {type(dt).__name__}")
    for k, v in dt.items():
        key = str(k)
        if prevent_delimiter and delimiter in key:
            raise ValueError(f"Found delimiter `{delimiter}` in key `{key}` when trying to flatten the dict")
        if isinstance(v, Mapping) and v:
            visit(v, key)
        elif flatten_list and isinstance(v, (list, tuple)) and any(isinstance(x, Mapping) for x in v):
            visit(v, key)
        else:
            out[key] = v
    return out


def unflatten_dict(dt: Mapping[str, Any], delimiter: str = "/") -> Dict[str, Any]:
    """The inverse of ``flatten_dict`` (lists stay dicts keyed by index)."""
    out: Dict[str, Any] = {}
    for key, value in dt.items():
        parts = key.split(delimiter)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"`{delimiter.join(parts[:i + 1])}` is both a value and a prefix of `{key}`")
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise ValueError(f"`{key}` is both a value and a prefix of other keys")
        node[parts[-1]] = value
    return out


def unflattened_lookup(flat_key: str, lookup: Union[Mapping, Sequence], delimiter: str = "/", **kwargs: Any) -> Any:
    """The value a flattened key names in a nested dict (list items by
    index): ``unflattened_lookup("a/0/b", {"a": [{"b": 1}]})`` is 1. A
    missing key raises ``KeyError``, unless a ``default`` is given."""
    node: Any = lookup
    for part in flat_key.split(delimiter):
        try:
            if isinstance(node, Mapping):
                node = node[part]
            elif isinstance(node, (list, tuple)):
                node = node[int(part)]
            else:
                raise KeyError(part)
        except (KeyError, IndexError, ValueError):
            if "default" in kwargs:
                return kwargs["default"]
            raise KeyError(flat_key) from None
    return node


def deep_update(original: Dict[str, Any], new_dict: Mapping[str, Any], new_keys_allowed: bool = False,
                allow_new_subkey_list: Optional[List[str]] = None,
                override_all_if_type_changes: Optional[List[str]] = None) -> Dict[str, Any]:
    """Updates ``original`` in place with ``new_dict``, nested dicts key by
    key, and returns it. A key ``original`` lacks is an error unless
    ``new_keys_allowed``; below the keys in ``allow_new_subkey_list`` new
    keys are allowed; a dict of a key in ``override_all_if_type_changes``
    whose ``type`` changes replaces the old one whole."""
    allow_new_subkey_list = allow_new_subkey_list or []
    override_all_if_type_changes = override_all_if_type_changes or []
    for k, value in new_dict.items():
        if k not in original and not new_keys_allowed:
            raise Exception(f"Unknown config parameter `{k}` ")
        if isinstance(original.get(k), dict) and isinstance(value, Mapping):
            if (k in override_all_if_type_changes and "type" in value and "type" in original[k]
                    and value["type"] != original[k]["type"]):
                original[k] = copy.deepcopy(dict(value))
            elif k in allow_new_subkey_list:
                deep_update(original[k], value, True)
            else:
                deep_update(original[k], value, new_keys_allowed)
        else:
            original[k] = copy.deepcopy(value) if isinstance(value, (dict, list)) else value
    return original


def merge_dicts(d1: Mapping[str, Any], d2: Mapping[str, Any]) -> Dict[str, Any]:
    """A new dict: ``d1`` with ``d2`` laid over it, nested dicts merged key by key."""
    merged = copy.deepcopy(dict(d1))
    deep_update(merged, d2, new_keys_allowed=True)
    return merged


def validate_save_restore(trainable_cls: type, config: Optional[Dict[str, Any]] = None, num_gpus: int = 0) -> bool:
    """Checks, in this process, that a class trainable's ``save_checkpoint``
    and ``load_checkpoint`` agree: one instance trains three steps and
    saves; a second restores from that and trains a step; a third, never
    restored, trains four. Raises ``AssertionError`` naming what broke;
    True otherwise. (``num_gpus`` is Ray's; this runs where it is called.)"""
    import tempfile

    from ..._trainable import Trainable

    if not (isinstance(trainable_cls, type) and issubclass(trainable_cls, Trainable)):
        raise TypeError(f"validate_save_restore takes a tune.Trainable subclass, not {trainable_cls!r}")
    config = dict(config or {})
    first = trainable_cls(config=config)
    for _ in range(3):
        first.train()
    with tempfile.TemporaryDirectory(prefix="nestor-validate-") as d:
        path = first.save(os.path.join(d, "checkpoint"))
        assert os.path.isdir(path), f"{trainable_cls.__name__}.save() left no checkpoint directory"
        second = trainable_cls(config=config)
        second.restore(path)
        second._iteration = first.iteration
        restored = second.train()
    fresh = trainable_cls(config=config)
    for _ in range(3):
        fresh.train()
    expected = fresh.train()
    for t in (first, second, fresh):
        t.stop()
    assert second.iteration == 4, f"{trainable_cls.__name__}: the restored trainable is at iteration {second.iteration}, not 4"
    assert restored.get("iterations_since_restore") == 1, f"{trainable_cls.__name__}: restore() did not start a new run of iterations"
    changed = {k for k in expected if k in restored and _comparable(expected[k]) and _comparable(restored[k])
               and k not in _VOLATILE and expected[k] != restored[k]}
    assert not changed, (f"{trainable_cls.__name__}: after a save and a restore, step 4 reported "
                         f"{ {k: restored[k] for k in sorted(changed)} } where an uninterrupted run reported "
                         f"{ {k: expected[k] for k in sorted(changed)} }: save_checkpoint/load_checkpoint lose state")
    return True


#: Result keys that differ between runs of the same steps.
_VOLATILE = {"time_this_iter_s", "time_total_s", "timestamp", "date", "pid", "hostname", "node_ip", "time_since_restore",
             "iterations_since_restore", "timesteps_since_restore"}


def _comparable(v: Any) -> bool:
    return isinstance(v, (int, float, str, bool)) and not (isinstance(v, float) and v != v)


def diagnose_serialization(trainable: Callable) -> Union[bool, Set[str]]:
    """Whether ``trainable`` pickles as nestor ships it (cloudpickle, by
    value); if not, prints and returns the names of the globals and closure
    variables it uses that do not (often a lock, a client or an open file:
    create those inside the trainable)."""
    import inspect

    import cloudpickle

    def pickles(obj: Any) -> Optional[str]:
        try:
            cloudpickle.dumps(obj)
            return None
        except Exception as e:  # noqa: BLE001 - any failure to pickle is the answer
            return f"{type(e).__name__}: {e}"

    if pickles(trainable) is None:
        print("Serialization check passed: the trainable pickles.")
        return True
    func = trainable
    if inspect.isclass(trainable):
        members = [m for m in vars(trainable).values() if inspect.isfunction(m)]
    else:
        members = [func] if inspect.isfunction(func) else []
    failing: Set[str] = set()
    for m in members:
        found = inspect.getclosurevars(m)
        for name, value in {**found.globals, **found.nonlocals}.items():
            why = pickles(value)
            if why is not None:
                print(f"  {name} ({type(value).__name__}) does not pickle: {why}")
                failing.add(name)
    print(f"Serialization check failed: {sorted(failing) or 'the trainable itself'} cannot be pickled; "
          "create such objects inside the trainable, or pass them with tune.with_parameters")
    return failing


def wait_for_gpu(gpu_id: Optional[Union[int, str]] = None, target_util: float = 0.01, retry: int = 20,
                 delay_s: int = 5, gpu_memory_limit: Optional[float] = None) -> bool:
    """Waits until this trial's GPU (the first of ``CUDA_VISIBLE_DEVICES``,
    or ``gpu_id``) has at most ``target_util`` of its memory in use, as
    ``nvidia-smi`` reports it, checking ``retry`` times ``delay_s`` apart:
    a GPU a trial just left may still be freeing its memory. True once it
    is; ``RuntimeError`` when it never is, or there is no GPU."""
    if gpu_memory_limit is not None:
        target_util = gpu_memory_limit
    if gpu_id is None:
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        if not visible:
            raise RuntimeError("wait_for_gpu: this trial was given no GPU (CUDA_VISIBLE_DEVICES is empty); "
                               "ask for one with resources_per_worker={'GPU': 1} or use_gpu=True")
        gpu_id = visible[0].strip()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise RuntimeError("wait_for_gpu: nvidia-smi is not on PATH, so GPU memory cannot be read")
    for _ in range(max(1, retry)):
        out = subprocess.run([smi, f"--id={gpu_id}", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"wait_for_gpu: nvidia-smi --id={gpu_id}: {out.stderr.strip() or out.stdout.strip()}")
        used, total = (float(x) for x in out.stdout.strip().splitlines()[0].split(","))
        if total > 0 and used / total <= target_util:
            return True
        time.sleep(delay_s)
    raise RuntimeError(f"wait_for_gpu: GPU {gpu_id} still had more than {target_util:.0%} of its memory in use "
                       f"after {retry} checks {delay_s} s apart")
