"""``ray.air.integrations.mlflow.MLflowLoggerCallback``, run by nestor: one
MLflow run per trial under a parent run for the sweep, through the
tracking server's REST API."""

from typing import Any, Dict, Optional

from ...tune.logger import _BinaryLogger


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


__all__ = ["MLflowLoggerCallback"]
