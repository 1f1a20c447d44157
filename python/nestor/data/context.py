"""Ray Data's settings (``ray.data.context``): ``DataContext.get_current()``
holds them, as in Ray, so a script that sets them runs. nestor reads each
rank's share straight from the files with Arrow: the settings of Ray's
streaming executor (block sizes, progress bars, resources) change nothing."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass
class ExecutionResources:
    """Ray's resource limits for its data executor (accepted, unused)."""

    cpu: Optional[float] = None
    gpu: Optional[float] = None
    object_store_memory: Optional[float] = None


@dataclass
class ExecutionOptions:
    """Ray's data executor options (accepted, unused): nestor's ranks read their own shares."""

    resource_limits: ExecutionResources = field(default_factory=ExecutionResources)
    exclude_resources: ExecutionResources = field(default_factory=ExecutionResources)
    locality_with_output: Any = False
    preserve_order: bool = False
    actor_locality_enabled: bool = True
    verbose_progress: bool = False


class DataContext:
    """Ray Data's settings for this process: any attribute may be set and read back."""

    _current: Optional["DataContext"] = None

    def __init__(self, **settings: Any):
        self.execution_options = ExecutionOptions()
        self.enable_progress_bars = True
        self.target_max_block_size = 128 * 1024 * 1024
        self.target_min_block_size = 1024 * 1024
        self.use_push_based_shuffle = False
        self.enable_tensor_extension_casting = True
        self.__dict__.update(settings)

    @classmethod
    def get_current(cls) -> "DataContext":
        """This process's settings (made on first use)."""
        if cls._current is None:
            cls._current = cls()
        return cls._current

    @classmethod
    def _set_current(cls, context: "DataContext") -> None:
        cls._current = context

    def copy(self) -> "DataContext":
        return DataContext(**dict(self.__dict__))

    def set_config(self, key: str, value: Any) -> None:
        self.__dict__.setdefault("_config", {})[key] = value

    def get_config(self, key: str, default: Any = None) -> Any:
        config: Dict[str, Any] = self.__dict__.get("_config", {})
        return config.get(key, default)


#: Ray's older name.
DatasetContext = DataContext

__all__ = ["DataContext", "DatasetContext", "ExecutionOptions", "ExecutionResources"]
