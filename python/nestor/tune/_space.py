"""Search-space functions with Ray Tune's names and meanings. Each returns a
domain the driver writes into the experiment's ``[space]`` table, where the
binary checks it (an impossible domain is refused naming its key) and
samples it: no sampling happens in Python."""

from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from .._toml import Inline


class Domain:
    """A distribution over one parameter (``nestor.tune.uniform(0, 1)`` ...)."""

    def __init__(self, kind: str, args: Sequence[Any]):
        self.kind = kind
        self.args = list(args)

    def _toml(self) -> Inline:
        return Inline({self.kind: self.args})

    def __repr__(self) -> str:
        return f"tune.{self.kind}({', '.join(map(repr, self.args))})"


def uniform(lower: float, upper: float) -> Domain:
    """A float drawn uniformly from [lower, upper)."""
    return Domain("uniform", [lower, upper])


def quniform(lower: float, upper: float, q: float) -> Domain:
    """uniform, rounded to a multiple of q."""
    return Domain("quniform", [lower, upper, q])


def loguniform(lower: float, upper: float, base: float = 10) -> Domain:
    """A float drawn uniformly in log space between lower and upper (both > 0)."""
    return Domain("loguniform", [lower, upper] if base == 10 else [lower, upper, base])


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> Domain:
    """loguniform, rounded to a multiple of q."""
    return Domain("qloguniform", [lower, upper, q] if base == 10 else [lower, upper, q, base])


def randn(mean: float = 0.0, sd: float = 1.0) -> Domain:
    """A float drawn from a normal distribution."""
    return Domain("randn", [mean, sd])


def qrandn(mean: float, sd: float, q: float) -> Domain:
    """randn, rounded to a multiple of q."""
    return Domain("qrandn", [mean, sd, q])


def randint(lower: int, upper: int) -> Domain:
    """An integer in [lower, upper): upper is excluded, as in Ray."""
    return Domain("randint", [lower, upper])


def qrandint(lower: int, upper: int, q: int = 1) -> Domain:
    """An integer in [lower, upper] (upper included, as in Ray), a multiple of q."""
    return Domain("qrandint", [lower, upper, q])


def lograndint(lower: int, upper: int, base: float = 10) -> Domain:
    """An integer in [lower, upper) drawn uniformly in log space."""
    return Domain("lograndint", [lower, upper] if base == 10 else [lower, upper, base])


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> Domain:
    """lograndint, upper included, a multiple of q."""
    return Domain("qlograndint", [lower, upper, q] if base == 10 else [lower, upper, q, base])


def choice(categories: Sequence[Any]) -> Domain:
    """One of ``categories``, each equally likely."""
    if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence):
        raise TypeError(f"tune.choice takes a list of values, not {type(categories).__name__}")
    return Domain("choice", list(categories))


def grid_search(values: Sequence[Any]) -> Domain:
    """Every value, each in its own trial (crossed with the other grid axes)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"tune.grid_search takes a list of values, not {type(values).__name__}")
    return Domain("grid", list(values))


class _SampleFrom:
    def __init__(self, func: Callable[..., Any]):
        self.func = func


def sample_from(func: Callable[..., Any]) -> Any:
    """Ray's escape hatch for values computed by a Python function, of no
    arguments or of the spec (``lambda spec: spec.config.width * 2``): called
    for every new trial, in the script's process, once the binary has
    sampled the rest of its config (``nestor._hooks``)."""
    return _SampleFrom(func)


def to_space(space: Mapping[str, Any], prefix: str = "", sampled: Optional[Dict[str, Callable[..., Any]]] = None) -> Dict[str, Any]:
    """The ``[space]`` table of a ``param_space`` dict (nested dicts nest).
    ``tune.sample_from`` functions go to ``sampled`` by dotted path (the
    driver computes their values per trial)."""
    if not isinstance(space, Mapping):
        raise TypeError(f"param_space must be a dict, not {type(space).__name__}")
    out: Dict[str, Any] = {}
    for key, v in space.items():
        path = f"{prefix}{key}"
        if not isinstance(key, str) or not key:
            raise ValueError(f"param_space: key {path!r} must be a non-empty string")
        if isinstance(v, Domain):
            out[key] = v._toml()
        elif isinstance(v, _SampleFrom):
            if sampled is None:
                raise ValueError(f"param_space: {path}: tune.sample_from is not allowed here")
            if not callable(v.func):
                raise ValueError(f"param_space: {path}: tune.sample_from needs a function, not {v.func!r}")
            sampled[path] = v.func
        elif isinstance(v, Mapping):
            inner = to_space(v, path + ".", sampled)
            if inner or not any(isinstance(x, _SampleFrom) for x in v.values()):
                out[key] = inner
        else:
            out[key] = _constant(path, v)
    return out


def _constant(path: str, v: Any) -> Any:
    if isinstance(v, tuple):
        v = list(v)
    if isinstance(v, list):
        return [_constant(f"{path}[{i}]", x) for i, x in enumerate(v)]
    if isinstance(v, Mapping):
        return {k: _constant(f"{path}.{k}", x) for k, x in v.items()}
    if v is None:
        raise ValueError(f"param_space: {path}: None cannot be stored in a config; leave the key out")
    if isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "item") and callable(v.item):
        return v.item()
    raise ValueError(
        f"param_space: {path}: {type(v).__name__} is not a number, string, boolean, list or dict; "
        "pass objects to the trainable with tune.with_parameters"
    )
