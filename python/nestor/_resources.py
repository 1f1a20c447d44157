"""A trial's resources as Ray describes them (``PlacementGroupFactory``):
bundles of resources, the first the trial's own (its "head"), and how they
are placed. nestor gives a function or class trainable the sum of the
bundles on one machine; ``get_trial_resources()`` answers with one."""

import os
from typing import Any, Dict, Iterator, List, Mapping, Optional

_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class PlacementGroupFactory(Mapping):
    """Ray's ``PlacementGroupFactory(bundles, strategy="PACK")``. Read as a
    mapping it is the resources it requires in all (``pgf["CPU"]``), as
    nestor's trial resources always were."""

    def __init__(self, bundles: List[Mapping[str, float]], strategy: str = "PACK", *args: Any, **kwargs: Any):
        if not isinstance(bundles, (list, tuple)) or not bundles:
            raise ValueError("PlacementGroupFactory: bundles must be a non-empty list of dicts of resources")
        checked: List[Dict[str, float]] = []
        for i, b in enumerate(bundles):
            if not isinstance(b, Mapping):
                raise ValueError(f"PlacementGroupFactory: bundles[{i}] is {type(b).__name__}, not a dict of resources")
            for k, v in b.items():
                if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"PlacementGroupFactory: bundles[{i}][{k!r}] = {v!r} is not a non-negative number")
            checked.append({str(k): float(v) for k, v in b.items()})
        if strategy not in _STRATEGIES:
            raise ValueError(f"PlacementGroupFactory: strategy {strategy!r} is not one of {', '.join(_STRATEGIES)}")
        self.bundles = checked
        self.strategy = strategy

    @property
    def head_bundle_is_empty(self) -> bool:
        return not any(self.bundles[0].values())

    @property
    def head_cpus(self) -> float:
        return self.bundles[0].get("CPU", 0.0)

    @property
    def required_resources(self) -> Dict[str, float]:
        total: Dict[str, float] = {}
        for b in self.bundles:
            for k, v in b.items():
                total[k] = total.get(k, 0.0) + v
        return {k: v for k, v in total.items() if v}

    def __getitem__(self, key: str) -> float:
        return self.required_resources[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.required_resources)

    def __len__(self) -> int:
        return len(self.required_resources)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlacementGroupFactory):
            return self.bundles == other.bundles and self.strategy == other.strategy
        return isinstance(other, Mapping) and dict(self.required_resources) == dict(other)

    def __hash__(self) -> int:
        return hash((tuple(tuple(sorted(b.items())) for b in self.bundles), self.strategy))

    def __repr__(self) -> str:
        return f"PlacementGroupFactory({self.bundles!r}, strategy={self.strategy!r})"


def this_trials() -> PlacementGroupFactory:
    """What this rank was given: its CPUs (``OMP_NUM_THREADS``, which nestor
    sets to them) and its GPUs (``CUDA_VISIBLE_DEVICES``)."""
    cpus = float(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    gpus = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    bundle: Dict[str, float] = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = float(len(gpus))
    return PlacementGroupFactory([bundle])


def as_resources(resources: Optional[Any]) -> Optional[Dict[str, float]]:
    """``with_resources``'s argument as one dict: a PlacementGroupFactory's bundles summed."""
    if resources is None:
        return None
    if isinstance(resources, PlacementGroupFactory):
        return dict(resources.required_resources)
    return dict(resources)
