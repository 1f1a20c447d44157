"""``ray.air.integrations.mlflow``: ``MLflowLoggerCallback``, run by nestor
(one MLflow run per trial under a parent run for the sweep, through the
tracking server's REST API), and ``setup_mlflow``, which a training
function calls to log to MLflow itself."""

import os
from typing import Any, Dict, Optional

from ...tune.logger import _BinaryLogger
from . import _Noop


class MLflowLoggerCallback(_BinaryLogger):
    """A run per trial: params, every metric with its step, state and status."""

    def __init__(self, tracking_uri: Optional[str] = None, *, registry_uri: Optional[str] = None,
                 experiment_name: Optional[str] = None, tags: Optional[Dict[str, Any]] = None,
                 tracking_token: Optional[str] = None, save_artifact: bool = False) -> None:
        if registry_uri or tracking_token or save_artifact:
            raise ValueError("MLflowLoggerCallback: registry_uri, tracking_token and save_artifact are not supported by "
                             "nestor yet; the best checkpoint is one `nestor best DIR` away")
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}

    def _table(self) -> Dict[str, Any]:
        t: Dict[str, Any] = {"type": "mlflow"}
        if self.tracking_uri:
            t["tracking_uri"] = self.tracking_uri
        if self.experiment_name:
            t["experiment_name"] = self.experiment_name
        if self.tags:
            t["tags"] = self.tags
        return t


def setup_mlflow(config: Optional[Dict[str, Any]] = None, tracking_uri: Optional[str] = None, registry_uri: Optional[str] = None,
                 experiment_id: Optional[str] = None, experiment_name: Optional[str] = None,
                 tracking_token: Optional[str] = None, artifact_location: Optional[str] = None, run_name: Optional[str] = None,
                 create_experiment_if_not_exists: bool = False, tags: Optional[Dict[str, Any]] = None,
                 rank_zero_only: bool = True) -> Any:
    """Ray's ``setup_mlflow``, in a training function: sets MLflow's tracking
    URI and experiment, starts a run named after the trial (its config as
    the run's parameters) and returns the ``mlflow`` module to log with.
    With ``rank_zero_only`` (the default) the other ranks get a stand-in
    whose calls do nothing. The URI and experiment default to
    ``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_NAME``, as in Ray."""
    from ... import get_context

    ctx = get_context()
    if rank_zero_only and ctx.world_rank != 0:
        return _Noop()
    try:
        import mlflow
    except ImportError:
        raise ImportError("setup_mlflow needs mlflow in the training function's Python: pip install mlflow") from None
    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        mlflow.set_tracking_uri(uri)
    if registry_uri:
        mlflow.set_registry_uri(registry_uri)
    name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if experiment_id:
        mlflow.set_experiment(experiment_id=experiment_id)
    elif name:
        if mlflow.get_experiment_by_name(name) is None:
            if not create_experiment_if_not_exists:
                raise ValueError(f"setup_mlflow: MLflow has no experiment {name!r}; pass create_experiment_if_not_exists=True")
            mlflow.create_experiment(name, artifact_location=artifact_location)
        mlflow.set_experiment(name)
    run_tags = {str(k): str(v) for k, v in (tags or {}).items()}
    run_tags.setdefault("trial_id", ctx.trial_id)
    mlflow.start_run(run_name=run_name or ctx.trial_id, tags=run_tags)
    if config:
        from ...tune.utils import flatten_dict

        mlflow.log_params({k: v for k, v in flatten_dict(dict(config)).items()})
    return mlflow


__all__ = ["MLflowLoggerCallback", "setup_mlflow"]
