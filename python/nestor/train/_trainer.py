"""The trainers' common part: a training function run on every worker of
one run, ``fit()`` as a sweep of one trial."""

import os
import sys
from typing import Any, Callable, Dict, List, Optional

from .. import _contract
from . import RunConfig, ScalingConfig
from .._results import Result, TrainingFailedError


class _Trainer:
    """A data-parallel run of ``train_loop_per_worker`` (Ray's ``DataParallelTrainer``)."""

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: Optional[Dict[str, Any]] = None,
                 scaling_config: Optional[ScalingConfig] = None, run_config: Optional[RunConfig] = None,
                 datasets: Optional[Dict[str, Any]] = None, resume_from_checkpoint: Any = None, metadata: Any = None,
                 dataset_config: Any = None, **_framework: Any):
        if not callable(train_loop_per_worker):
            raise TypeError(f"train_loop_per_worker must be a function, not {type(train_loop_per_worker).__name__}")
        from ..data import DataConfig, Dataset

        self.datasets: Dict[str, Dataset] = {}
        for name, ds in (datasets or {}).items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"datasets: names must be non-empty strings, not {name!r}")
            if not isinstance(ds, Dataset):
                raise ValueError(f"datasets[{name!r}] is {type(ds).__name__}: give a nestor.data Dataset "
                                 "(nestor.data.read_parquet, read_csv, read_json, from_pandas, from_numpy, from_items)")
            self.datasets[name] = ds
        if dataset_config is not None and not isinstance(dataset_config, DataConfig):
            raise ValueError(f"dataset_config is {type(dataset_config).__name__}: give a nestor.train.DataConfig")
        self.dataset_config = dataset_config or DataConfig()
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError(f"{type(self).__name__}(metadata={metadata!r}): give a dict (ranks read it with get_context().get_metadata())")
        #: What the ranks' ``get_context().get_metadata()`` returns (Ray's trainer metadata).
        self.metadata: Dict[str, Any] = dict(metadata or {})
        self.resume_from_checkpoint: Optional[str] = None
        if resume_from_checkpoint is not None:
            path = os.fspath(getattr(resume_from_checkpoint, "path", resume_from_checkpoint))
            if "://" not in path and not os.path.isdir(path):
                raise ValueError(f"resume_from_checkpoint={path!r} is not a directory")
            self.resume_from_checkpoint = path
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = dict(train_loop_config or {})
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config
        self.__name__ = type(self).__name__

    def _parts(self) -> Dict[str, Any]:
        return {
            "blob": {"kind": "trainer", "fn": self.train_loop_per_worker, "train_loop_config": self.train_loop_config,
                     "resume_from_checkpoint": self.resume_from_checkpoint, "datasets": self._planner(),
                     "metadata": self.metadata},
            "scaling": self.scaling_config,
            "run_config": self.run_config,
            "train_loop_config": self.train_loop_config,
        }

    def _planner(self) -> Any:
        """What the driver calls, once it knows the experiment's directory,
        to check the data sets and count their rows (None without any)."""
        if not self.datasets:
            return None
        datasets, config = dict(self.datasets), self.dataset_config
        workers = int(self.scaling_config.num_workers) if isinstance(self.scaling_config.num_workers, int) else None

        def plan(storage: str) -> Dict[str, Any]:
            if config._custom():
                # Ray's custom ingest: the DataConfig says what each worker reads.
                from ..data import _planning_into

                if workers is None:
                    raise ValueError("a DataConfig with its own configure() needs a fixed ScalingConfig(num_workers=...)")
                with _planning_into(storage):
                    per_rank = config.configure(datasets, workers, None, None)
                if not isinstance(per_rank, list) or len(per_rank) != workers or not all(isinstance(d, dict) for d in per_rank):
                    raise ValueError(f"{type(config).__name__}.configure must return a list of {workers} dicts "
                                     "(one per worker: name -> DataIterator or Dataset)")
                with _planning_into(storage):
                    return {"__per_rank__": [{n: _shard_of(n, v) for n, v in d.items()} for d in per_rank]}
            plans = {}
            for name, ds in datasets.items():
                p = ds._plan(name, storage)
                p.split = config._splits(name)
                plans[name] = p
            return plans

        return plan

    def fit(self) -> Result:
        """Runs the training function once on every worker; returns its
        result, or raises ``TrainingFailedError`` naming the failed rank, its
        node and its traceback."""
        if _contract.inside():
            return self._fit_in_trial()
        return self._fit()

    def _fit_in_trial(self) -> Result:
        """``fit()`` inside a Tune trial (Ray Train V2's pattern): the trial
        books the trainer's ``ScalingConfig`` in place of its own bundle,
        then the driver runs the trainer's ranks on it as the trial's own
        run (named ``train`` unless named, under the trial's directory unless
        ``RunConfig.storage_path`` says where). Each result comes back here,
        where the ``RunConfig``'s ``UserCallback``s run (``TuneReportCallback``
        reports it to the trial). A run of the same name that ran before (the
        trial restarted) goes on from its latest committed checkpoint. When
        the trial is stopped the trainer's run stops, and the function ends
        cleanly."""
        import time

        from .. import _driver, _get_channel, get_context
        from ..tune import TuneConfig, Tuner, _plan_datasets
        from ..tune.integration.ray_train import TuneReportCallback
        from . import Checkpoint, UserCallback

        rc = self.run_config or RunConfig()
        plan = _contract.plan()
        trial_dir = (plan.trial_dir if plan else "") or os.getcwd()
        name = rc.name or "train"
        storage = os.path.expanduser(rc.storage_path) if rc.storage_path else os.path.join(trial_dir, "train")
        if _driver.is_url(storage):
            # Checkpoints in the bucket; its logs and results beside the trial's.
            run_dir, bucket = os.path.join(trial_dir, "train", name), storage.rstrip("/") + "/" + name
        else:
            run_dir, bucket = os.path.join(os.path.abspath(storage), name), None
        callbacks = [c for c in rc.callbacks or [] if isinstance(c, UserCallback)]
        ignored = [type(c).__name__ for c in rc.callbacks or [] if not isinstance(c, UserCallback)]
        if ignored:
            print(f"nestor: a trainer inside a trial runs ray.train.UserCallbacks only; {', '.join(ignored)} ignored",
                  file=sys.stderr)
        ctx, channel = get_context(), _get_channel()
        # The trainer's workers are the trial's: its ScalingConfig is booked
        # in place of the trial's own bundle (waiting while others hold them).
        channel.book(ctx, self.scaling_config._trainer())
        blob = _driver.write_blob(run_dir, _plan_datasets(self._parts()["blob"], run_dir))
        trainer = Tuner(self, tune_config=TuneConfig(num_samples=1))._experiment(name, blob, run_dir)["trainer"]
        trainer["warm"] = False
        for key in ("num_workers_from",):
            trainer.pop(key, None)
        run: Dict[str, Any] = {"name": name, "dir": run_dir, "trainer": trainer, "config": {}}
        if bucket:
            run["storage"] = bucket
        fc = rc.failure_config
        if fc is not None and fc.max_failures:
            run["failure"] = {"max_failures": int(fc.max_failures)}
        cc = rc.checkpoint_config
        if cc is not None:
            keep = {k: v for k, v in cc._table().items() if k in ("num_to_keep", "score_attribute", "score_order")}
            if keep:
                run["checkpoint"] = keep
        history: List[Dict[str, Any]] = []
        checkpoints: List[Dict[str, Any]] = []
        ended: Dict[str, Any] = {}
        began = last = time.time()
        for update in channel.run_trainer(ctx, run):
            if "result" in update:
                r = update["result"]
                now = time.time()
                metrics = {**(r.get("extra") or {}), **r["metrics"], "training_iteration": r["training_iteration"],
                           "time_this_iter_s": now - last, "time_total_s": now - began, "timestamp": int(now)}
                last = now
                history.append(metrics)
                checkpoint = Checkpoint(r["checkpoint"]) if r.get("checkpoint") else None
                if checkpoint is not None:
                    checkpoints.append({"uri": r["checkpoint"], "metrics": r["metrics"], "training_iteration": r["training_iteration"]})
                ranks = [metrics] + [dict(m) for m in (r.get("rank_metrics") or [])[1:]]
                for c in callbacks:
                    c.after_report(None, ranks, checkpoint)
            elif "restarted" in update:
                r = update["restarted"]
                print(f"nestor: the trainer's workers failed ({r['failure'].splitlines()[0] if r['failure'] else ''}); "
                      f"restarting from {r.get('from') or 'the start'}", file=sys.stderr)
                resumed = int(os.path.basename(r["from"].rstrip("/")).split("_")[-1]) if r.get("from") else 0
                history = [h for h in history if h["training_iteration"] <= resumed]
            elif "ended" in update:
                ended = update["ended"]
        stopped = any(c.stopped for c in callbacks if isinstance(c, TuneReportCallback))
        error = ended.get("error") if ended.get("status") == "failed" else None
        if not ended:
            error = "the driver ended the trainer's run without a word"
        if error is not None:
            failure = TrainingFailedError(f"the trainer's run {name} failed: {error}")
            for c in callbacks:
                c.after_exception(None, {0: failure})
        if stopped or (ended.get("status") == "stopped" and error is None):
            raise SystemExit(0)  # the trial was stopped: its function ends cleanly
        kept = [c for c in checkpoints if _driver.is_url(c["uri"]) or os.path.isdir(c["uri"])]
        result = Result({"trial_id": name, "config": dict(self.train_loop_config), "status": "ERROR" if error else "TERMINATED",
                         "metrics": history[-1] if history else {}, "path": run_dir, "history": history, "checkpoints": kept,
                         "error": error, "restarts": int(ended.get("failures", 0))}, os.path.dirname(run_dir))
        if result.error is not None:
            raise result.error
        return result

    def _fit(self) -> Result:
        from .. import _driver
        from ..tune import TuneConfig, Tuner

        rc = self.run_config
        if rc is not None and rc.name:
            path = _driver.experiment_dirs(rc.storage_path, rc.name)
            if Tuner.can_restore(path):
                # Ray Train's rule: a run of the same name and storage continues from its latest checkpoint.
                print(f"nestor: {path} holds this run already: it goes on from its latest checkpoint", file=sys.stderr)
                grid = Tuner.restore(path, self).fit()
                result = grid[0]
                if result.error is not None:
                    raise result.error
                return result
        grid = Tuner(self, tune_config=TuneConfig(num_samples=1)).fit()
        result = grid[0]
        if result.error is not None:
            raise result.error
        return result


def _shard_of(name: str, value: Any) -> Any:
    """What a custom ``DataConfig.configure`` gave one worker for ``name``:
    a ``DataIterator`` as it is, a data set as a reader of all its rows."""
    from ..data import DataIterator, Dataset

    if isinstance(value, DataIterator):
        return value
    if isinstance(value, Dataset):
        return value.iterator()
    raise ValueError(f"DataConfig.configure gave {type(value).__name__} for {name!r}: give a DataIterator "
                     "(Dataset.streaming_split) or a Dataset")
