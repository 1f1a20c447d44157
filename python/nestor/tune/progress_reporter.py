"""Ray Tune's progress reporters (``ray.tune.progress_reporter``): nestor
prints its own live trial table, so a reporter passed as
``RunConfig(progress_reporter=...)`` is accepted and set aside with a note.
Building one, and calling its ``add_metric_column``, works as in Ray."""

from typing import Any, Dict, List, Optional, Union


class ProgressReporter:
    """Ray's base of reporters: what a script sets on one is kept, and not shown."""

    def __init__(self, *args: Any, metric_columns: Optional[Union[List[str], Dict[str, str]]] = None,
                 parameter_columns: Optional[Union[List[str], Dict[str, str]]] = None, **kwargs: Any):
        self.metric_columns: Dict[str, str] = _columns(metric_columns)
        self.parameter_columns: Dict[str, str] = _columns(parameter_columns)
        self.settings = kwargs

    def add_metric_column(self, metric: str, representation: Optional[str] = None) -> None:
        self.metric_columns[metric] = representation or metric

    def add_parameter_column(self, parameter: str, representation: Optional[str] = None) -> None:
        self.parameter_columns[parameter] = representation or parameter

    def setup(self, *args: Any, **kwargs: Any) -> None:
        """Ray calls this with the sweep's settings; nestor never does."""

    def should_report(self, trials: List[Any], done: bool = False) -> bool:
        return False

    def report(self, trials: List[Any], done: bool, *sys_info: Any) -> None:
        """Never called: nestor shows its own table."""


def _columns(columns: Optional[Union[List[str], Dict[str, str]]]) -> Dict[str, str]:
    if columns is None:
        return {}
    return dict(columns) if isinstance(columns, dict) else {c: c for c in columns}


class TuneReporterBase(ProgressReporter):
    """Ray's base of its table reporters."""


class CLIReporter(TuneReporterBase):
    """Ray's terminal table: nestor's own table is shown instead."""


class JupyterNotebookReporter(TuneReporterBase):
    """Ray's notebook table: nestor's own table is shown instead."""


class RemoteReporterMixin:
    """Ray's mixin for reporters run on a remote driver."""


__all__ = ["CLIReporter", "JupyterNotebookReporter", "ProgressReporter", "RemoteReporterMixin", "TuneReporterBase"]
