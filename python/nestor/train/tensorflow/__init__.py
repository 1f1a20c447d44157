"""Ray Train's ``ray.train.tensorflow`` for nestor: ``TensorflowTrainer``
(a training function on every rank), ``TensorflowConfig`` (the backend that
gives each rank a port free on its node and writes ``TF_CONFIG``, the
cluster ``tf.distribute.MultiWorkerMirroredStrategy`` reads),
``prepare_dataset_shard`` and ``TensorflowCheckpoint``; Keras's
``ReportCheckpointCallback`` is in ``nestor.train.tensorflow.keras``. Built
on ``nestor.train.backend``.

As in Ray, the ranks run Keras 2 (``tf.keras`` is ``tf_keras``:
``TF_USE_LEGACY_KERAS=1``), which ``MultiWorkerMirroredStrategy``'s
``model.fit`` needs. TensorFlow is imported on first use
(``pip install "nestor[tensorflow]"``)."""

import importlib.util
import json
import os
from typing import Any, Callable, Dict, Optional

from .._framework import free_port
from ..backend import Backend, BackendConfig
from ..data_parallel_trainer import DataParallelTrainer

__all__ = ["TensorflowCheckpoint", "TensorflowConfig", "TensorflowTrainer", "prepare_dataset_shard"]


def _tensorflow() -> Any:
    from .._framework import need

    return need("tensorflow", "tensorflow")


def _legacy_keras_env() -> Dict[str, str]:
    """``TF_USE_LEGACY_KERAS=1`` where Keras 2 (``tf_keras``) is installed
    (without it ``tf.keras`` is Keras 3, whose ``fit`` does not run under
    ``MultiWorkerMirroredStrategy``)."""
    return {"TF_USE_LEGACY_KERAS": "1"} if importlib.util.find_spec("tf_keras") is not None else {}


class _TensorflowBackend(Backend):
    def on_start(self, worker_group: Any, backend_config: "TensorflowConfig") -> None:
        # Every rank's address and a port free on its node, in rank order: the cluster's workers.
        workers = worker_group.execute(lambda: f"{worker_group.node_ip}:{free_port()}")
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": worker_group.rank}})
        os.environ.update(_legacy_keras_env())

    def on_shutdown(self, worker_group: Any, backend_config: "TensorflowConfig") -> None:
        os.environ.pop("TF_CONFIG", None)


class TensorflowConfig(BackendConfig):
    """TensorFlow's cluster for the ranks of a run (Ray's ``TensorflowConfig``):
    each rank's ``TF_CONFIG`` names every rank's ``host:port`` and its own index."""

    @property
    def backend_cls(self) -> Any:
        return _TensorflowBackend


def prepare_dataset_shard(tf_dataset_shard: Any) -> Any:
    """A ``tf.data.Dataset`` of this rank's share (``get_dataset_shard(...).to_tf(...)``)
    with TensorFlow's auto-sharding turned off (the rows are split already)
    and prefetching on."""
    tf = _tensorflow()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf_dataset_shard.with_options(options).prefetch(tf.data.AUTOTUNE)


class TensorflowTrainer(DataParallelTrainer):
    """Ray's ``TensorflowTrainer(train_loop_per_worker, ...)``: the function
    runs on every rank with ``TF_CONFIG`` set, so a
    ``tf.distribute.MultiWorkerMirroredStrategy()`` it makes spans the ranks."""

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: Optional[Dict[str, Any]] = None,
                 tensorflow_config: Optional[TensorflowConfig] = None, scaling_config: Any = None, run_config: Any = None,
                 datasets: Optional[Dict[str, Any]] = None, **kwargs: Any):
        super().__init__(train_loop_per_worker, backend_config=tensorflow_config or TensorflowConfig(),
                         train_loop_config=train_loop_config, scaling_config=scaling_config, run_config=run_config,
                         datasets=datasets, **kwargs)

    def _parts(self) -> Any:
        parts = super()._parts()
        # Set when the rank starts, before anything imports TensorFlow.
        parts.setdefault("env", {}).update(_legacy_keras_env())
        return parts


class TensorflowCheckpoint:
    """Ray's ``TensorflowCheckpoint``: a Keras model saved as ``model.keras``
    in a checkpoint directory (``from_model``), and loaded back (``get_model``)."""

    MODEL_FILENAME = "model.keras"

    @classmethod
    def from_model(cls, model: Any, *, preprocessor: Any = None) -> Any:
        """A ``nestor.train.Checkpoint`` holding ``model`` (a new temporary
        directory; ``report`` copies it into the trial's storage)."""
        import tempfile

        from .. import Checkpoint

        d = tempfile.mkdtemp(prefix="nestor-keras-")
        model.save(os.path.join(d, cls.MODEL_FILENAME))
        return Checkpoint.from_directory(d)

    @classmethod
    def get_model(cls, checkpoint: Any, model: Any = None, model_definition: Any = None) -> Any:
        """The Keras model ``checkpoint`` holds, loaded by the Keras that saved
        it (Keras 2, ``tf_keras``, for what a ``TensorflowTrainer`` saved),
        whatever ``tf.keras`` is in this process."""
        with checkpoint.as_directory() as d:
            path = os.path.join(d, cls.MODEL_FILENAME)
            if not os.path.exists(path):
                raise ValueError(f"{checkpoint} holds no {cls.MODEL_FILENAME}")
            return _load_keras(path)


def _load_keras(path: str) -> Any:
    import zipfile

    from .._framework import need

    try:
        with zipfile.ZipFile(path) as z:
            version = str(json.loads(z.read("metadata.json")).get("keras_version", ""))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        version = ""
    if version.startswith("2."):
        return need("tf_keras", "tensorflow").models.load_model(path)
    return _tensorflow().keras.models.load_model(path)
