"""Ray Train's ``ray.train.lightgbm`` for nestor: ``LightGBMTrainer`` (a
training function on every rank, the ranks one LightGBM network),
``LightGBMConfig`` (the backend that gives each rank a port free on its
node and the list of every rank's address), ``get_network_params()`` (what
to merge into ``lgb.train``'s params) and ``RayTrainReportCallback``. Built
on ``nestor.train.backend``.

lightgbm is imported on first use (``pip install "nestor[lightgbm]"``)."""

import os
import tempfile
from typing import Any, Callable, Dict, List, Optional, Union

from ._framework import free_port, older_form_params
from .backend import Backend, BackendConfig
from .data_parallel_trainer import DataParallelTrainer

__all__ = ["LightGBMConfig", "LightGBMTrainer", "RayTrainReportCallback", "get_network_params"]

#: This rank's network settings (``on_training_start`` sets them).
_network: Dict[str, Any] = {}


def _lightgbm() -> Any:
    from ._framework import need

    return need("lightgbm", "lightgbm")


class _LightGBMBackend(Backend):
    def on_training_start(self, worker_group: Any, backend_config: "LightGBMConfig") -> None:
        # Every rank's address and a port free on its node, in rank order.
        addresses = worker_group.execute(lambda: (worker_group.node_ip, free_port()))
        _network.clear()
        _network.update(num_machines=len(addresses), local_listen_port=addresses[worker_group.rank][1],
                        machines=",".join(f"{host}:{port}" for host, port in addresses))

    def on_shutdown(self, worker_group: Any, backend_config: "LightGBMConfig") -> None:
        _network.clear()


class LightGBMConfig(BackendConfig):
    """LightGBM's network for the ranks of a run (Ray's ``LightGBMConfig``)."""

    @property
    def backend_cls(self) -> Any:
        return _LightGBMBackend


def get_network_params() -> Dict[str, Any]:
    """This rank's part of the LightGBM network (``num_machines``,
    ``local_listen_port``, ``machines``): merge it into ``lgb.train``'s
    params. Empty with one rank."""
    return dict(_network) if _network.get("num_machines", 1) > 1 else {}


class LightGBMTrainer(DataParallelTrainer):
    """Ray Train V2's ``LightGBMTrainer(train_loop_per_worker, ...)``: the
    function runs on every rank, ``get_network_params()`` joining the
    ranks into one LightGBM network (``tree_learner="data"``: each rank its
    share of the rows). Ray's older form, ``LightGBMTrainer(params=...,
    label_column=..., num_boost_round=..., datasets={"train": ..., "valid":
    ...})``, is this with a training function nestor writes
    (``RayTrainReportCallback`` reporting every round, a checkpoint at the end)."""

    def __init__(self, train_loop_per_worker: Optional[Callable[..., Any]] = None, *,
                 train_loop_config: Optional[Dict[str, Any]] = None, lightgbm_config: Optional[LightGBMConfig] = None,
                 scaling_config: Any = None, run_config: Any = None, datasets: Optional[Dict[str, Any]] = None,
                 params: Optional[Dict[str, Any]] = None, label_column: Optional[str] = None, num_boost_round: int = 10,
                 dataset_params: Optional[Dict[str, Any]] = None, **kwargs: Any):
        if train_loop_per_worker is None:
            from ._framework import older_form

            train_loop_per_worker = _legacy_loop
            train_loop_config = older_form("LightGBMTrainer", "__lightgbm__", train_loop_config, params, label_column, num_boost_round, datasets,
                                           {"dataset_params": dict(dataset_params or {})})
        super().__init__(train_loop_per_worker, backend_config=lightgbm_config or LightGBMConfig(), train_loop_config=train_loop_config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets, **kwargs)

    @staticmethod
    def get_model(checkpoint: Any, filename: str = "model.txt") -> Any:
        """The booster a checkpoint holds."""
        return RayTrainReportCallback.get_model(checkpoint, filename)


def _legacy_loop(config: Dict[str, Any]) -> None:
    """Ray's older ``LightGBMTrainer(params=, label_column=, ...)``: every data
    set's share as a ``lgb.Dataset``, ``lgb.train`` across the ranks (one
    network, ``tree_learner="data"``), resumed from the trial's checkpoint,
    reported every round."""
    import nestor

    from . import get_checkpoint, get_dataset_shard
    from .xgboost import _frame

    lgb = _lightgbm()
    settings = config["__lightgbm__"]
    label = settings["label_column"]
    params, rounds = older_form_params(config, "__lightgbm__")
    network = get_network_params()
    if network:
        params.setdefault("tree_learner", "data")
        params.update(network)
    data, names = {}, sorted(nestor._datasets, key=lambda n: (n != "train", n))
    for name in names:
        frame = _frame(get_dataset_shard(name))
        data[name] = lgb.Dataset(frame.drop(columns=[label]), label=frame[label], free_raw_data=False,
                                 reference=data.get("train"), **settings["dataset_params"])
    booster, done = None, 0
    checkpoint = get_checkpoint()
    if checkpoint:
        booster = RayTrainReportCallback.get_model(checkpoint)
        done = booster.current_iteration()
    lgb.train(params, data["train"], num_boost_round=max(rounds - done, 0),
              valid_sets=[data[n] for n in names], valid_names=names, init_model=booster,
              callbacks=[RayTrainReportCallback()])


class RayTrainReportCallback:
    """A LightGBM callback (``lgb.train(..., callbacks=[RayTrainReportCallback()])``)
    that reports the round's eval metrics (``{"valid-binary_logloss": ...}``,
    or the names ``metrics`` maps to) every round, with the booster as a
    checkpoint (``filename``, saved by rank 0) every ``frequency`` rounds
    and at the last round. A report of a stopped trial ends the training."""

    CHECKPOINT_NAME = "model.txt"

    def __init__(self, metrics: Optional[Union[str, List[str], Dict[str, str]]] = None, filename: str = CHECKPOINT_NAME,
                 frequency: int = 0, checkpoint_at_end: bool = True, results_postprocessing_fn: Optional[Callable[..., Any]] = None):
        if isinstance(metrics, str):
            metrics = [metrics]
        self._metrics, self._filename, self._frequency = metrics, filename, int(frequency)
        self._at_end, self._post = checkpoint_at_end, results_postprocessing_fn
        self.order = 20

    @classmethod
    def get_model(cls, checkpoint: Any, filename: str = CHECKPOINT_NAME) -> Any:
        """The booster ``checkpoint`` holds."""
        lgb = _lightgbm()
        with checkpoint.as_directory() as d:
            return lgb.Booster(model_file=os.path.join(d, filename))

    def _flat(self, results: List[Any]) -> Dict[str, float]:
        out = {f"{data}-{metric}": float(value) for data, metric, value, *_ in results}
        if isinstance(self._metrics, dict):
            return {name: out[key] for name, key in self._metrics.items() if key in out}
        if self._metrics:
            return {k: v for k, v in out.items() if k in self._metrics}
        return out

    def __call__(self, env: Any) -> None:
        from . import Checkpoint, get_context
        from .. import _report_or_stop

        metrics = self._flat(env.evaluation_result_list or [])
        if self._post is not None:
            metrics = self._post(metrics)
        rounds = env.iteration + 1
        last = rounds == env.end_iteration
        save = (self._frequency > 0 and rounds % self._frequency == 0) or (self._at_end and last)
        if save and get_context().get_world_rank() == 0:
            with tempfile.TemporaryDirectory() as d:
                env.model.save_model(os.path.join(d, self._filename))
                going = _report_or_stop(metrics, Checkpoint.from_directory(d))
        else:
            going = _report_or_stop(metrics)
        if not going:
            lgb = _lightgbm()
            raise lgb.callback.EarlyStopException(env.iteration, env.evaluation_result_list or [])
