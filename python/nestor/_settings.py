"""The driver's settings of a process (Ray's ``ray.init``): the resources
its sweeps schedule on, a Slurm cluster to run each trial on, whether the
ranks' output reaches the console. ``nestor`` re-exports ``init``,
``shutdown``, ``is_initialized`` and ``SlurmJobs``; ``nestor.tune`` reads
the rest when a sweep starts."""

import numbers
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional


#: The resources ``init`` declared (``[resources]`` of the sweeps this process runs).
_declared_resources: Dict[str, float] = {}

#: ``init(cluster=SlurmJobs(...))``: the experiment's ``[cluster]`` table, or None.
_cluster: Optional[Dict[str, Any]] = None


@dataclass
class SlurmJobs:
    """Each trial run a Slurm job of its own, submitted from where this
    driver runs (a login node): the experiment file's ``[cluster] backend =
    "slurm_jobs"`` and ``[cluster.jobs]``, given to :func:`init`. The
    experiment's directory (``RunConfig(storage_path=...)``) must be on a
    file system the nodes share."""

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    #: Each job's time limit, in Slurm's form ("90", "4:00:00", "1-12:00:00").
    time: Optional[str] = None
    #: More sbatch options, one word each ("--constraint=a100").
    sbatch: List[str] = field(default_factory=list)
    #: The most jobs queued or running at once.
    max_jobs: int = 16
    #: Seconds before a job's time limit that its ranks are told (get_preemption_info); 0: never.
    signal_s: int = 120
    #: Seconds between two readings of the jobs' states (one squeue call for all).
    poll_s: float = 10.0
    #: The address the nodes reach this machine at (default: its host name).
    report_address: Optional[str] = None

    def _table(self) -> Dict[str, Any]:
        jobs: Dict[str, Any] = {"max_jobs": int(self.max_jobs), "signal_s": int(self.signal_s), "poll_s": float(self.poll_s)}
        for k in ("partition", "account", "qos", "time"):
            if getattr(self, k) is not None:
                jobs[k] = str(getattr(self, k))
        if self.sbatch:
            jobs["sbatch"] = [str(o) for o in self.sbatch]
        table: Dict[str, Any] = {"backend": "slurm_jobs", "jobs": jobs}
        if self.report_address:
            table["report_address"] = self.report_address
        return table

#: ``ray.init`` arguments that only concern Ray's own processes.
_INIT_QUIET = {"ignore_reinit_error", "include_dashboard", "logging_level", "configure_logging",
               "runtime_env", "namespace", "dashboard_host", "dashboard_port", "local_mode", "_temp_dir"}


#: ``init(log_to_driver=False)``: the ranks' output stays in their logs, off the console.
_log_to_driver = True


def init(address: Optional[str] = None, *, num_cpus: Optional[float] = None, num_gpus: Optional[float] = None,
         resources: Optional[Mapping[str, float]] = None, cluster: Optional[SlurmJobs] = None, log_to_driver: bool = True,
         **kwargs: Any) -> None:
    """Ray's ``ray.init``: nestor has no cluster to start or join. ``num_cpus``,
    ``num_gpus`` and ``resources`` are the pool the sweeps of this process
    schedule on (the experiment's ``[resources]``), as in Ray;
    ``cluster=SlurmJobs(...)`` runs each trial run as a Slurm job of its
    own; ``log_to_driver=False`` keeps the ranks' output off this console
    (it is in their logs either way); other arguments are ignored with a note."""
    global _cluster, _log_to_driver
    _log_to_driver = bool(log_to_driver)
    if cluster is not None:
        if not isinstance(cluster, SlurmJobs):
            raise ValueError(f"init(cluster={cluster!r}): give nestor.SlurmJobs(...)")
        _cluster = cluster._table()
    for name, value in (("CPU", num_cpus), ("GPU", num_gpus)):
        if value is not None:
            if not isinstance(value, numbers.Real) or value < 0:
                raise ValueError(f"init(num_{name.lower()}s={value!r}): give a number >= 0")
            _declared_resources[name] = float(value)
    for name, value in (resources or {}).items():
        if not isinstance(value, numbers.Real) or value < 0:
            raise ValueError(f"init(resources={{{name!r}: {value!r}}}): give a number >= 0")
        _declared_resources[str(name)] = float(value)
    ignored = sorted(k for k in kwargs if k not in _INIT_QUIET)
    if address not in (None, "auto", "local"):
        ignored.insert(0, "address")
    if ignored:
        print(f"nestor: init({', '.join(ignored)}) ignored: nestor needs no cluster (inside a Slurm allocation "
              "it uses the allocation)", file=sys.stderr)


def shutdown() -> None:
    """Ray's ``ray.shutdown``: forgets what ``init`` declared."""
    global _cluster, _log_to_driver
    _declared_resources.clear()
    _cluster = None
    _log_to_driver = True


def is_initialized() -> bool:
    """Always True: nestor is ready without ``init``."""
    return True


SlurmJobs.__module__ = "nestor"
