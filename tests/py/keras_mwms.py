"""Keras under MultiWorkerMirroredStrategy across the ranks of a trial
(tests/tests/keras.rs; not named keras.py: this directory is on the path), on scikit-learn's bundled breast-cancer data (569
rows, 30 features) fed through nestor.data: ``get_dataset_shard`` ->
``to_tf`` -> ``prepare_dataset_shard``.

Usage: keras_mwms.py DIR MODE
  fit    TensorflowTrainer on 2 ranks, 4 epochs, ReportCheckpointCallback every epoch
  asha   a Tuner over the same trainer: 4 learning rates, ASHA in epochs (max_t=6, grace 1)
  tune-fn  a function trainable per trial (one process, Keras 3) with ray.tune.integration.keras's callback, under ASHA
Rank log lines: RANK <json> (the weights' fingerprint, the epochs run, the rows an epoch).
The driver prints LOADED <fingerprint> (the best checkpoint's model, loaded with
TensorflowCheckpoint.get_model) and, for asha, EPOCHS <json list> (epochs reported per trial).
"""

import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pandas as pd
from sklearn.datasets import load_breast_cancer

from nestor import data, train, tune
from nestor.train import RunConfig, ScalingConfig

root, mode = sys.argv[1], sys.argv[2]
x, y = load_breast_cancer(return_X_y=True)
x = (x - x.mean(0)) / x.std(0)
columns = [f"f{i}" for i in range(x.shape[1])]
frame = pd.DataFrame(x.astype("float32"), columns=columns).assign(label=y.astype("float32"))
dataset = data.from_pandas(frame)


def fingerprint(model):
    return hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]


def loop(config):
    import tensorflow as tf

    from nestor.train.tensorflow import prepare_dataset_shard
    from nestor.train.tensorflow.keras import ReportCheckpointCallback

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    shard = train.get_dataset_shard("train")
    ds = shard.to_tf(feature_columns=columns, label_columns="label", batch_size=32)
    ds = prepare_dataset_shard(ds.map(lambda f, label: (tf.stack([f[c] for c in columns], axis=1), label)))
    with strategy.scope():
        tf.keras.utils.set_random_seed(7)
        model = tf.keras.Sequential([tf.keras.Input((len(columns),)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=tf.keras.optimizers.Adam(config.get("lr", 0.01)), loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(ds, epochs=config.get("epochs", 4), verbose=0, callbacks=[ReportCheckpointCallback(metrics={"loss": "loss", "acc": "accuracy"})])
    ctx = train.get_context()
    print("RANK " + json.dumps({"rank": ctx.get_world_rank(), "model": fingerprint(model), "epochs": len(history.history["loss"]),
                                "rows": shard.count(), "workers": strategy.num_replicas_in_sync}), flush=True)


scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5})
from nestor.train.tensorflow import TensorflowCheckpoint, TensorflowTrainer  # noqa: E402

if mode == "fit":
    result = TensorflowTrainer(loop, train_loop_config={"epochs": 4}, scaling_config=scaling, datasets={"train": dataset},
                               run_config=RunConfig(name=mode, storage_path=os.path.join(root, "runs"))).fit()
    print(f"LOADED {fingerprint(TensorflowCheckpoint.get_model(result.checkpoint))}")
    print(f"METRIC {result.metrics['loss']}")
elif mode == "asha":
    from nestor.tune.schedulers import ASHAScheduler

    trainer = TensorflowTrainer(loop, train_loop_config={"epochs": 6}, scaling_config=scaling, datasets={"train": dataset})
    grid = tune.Tuner(trainer, param_space={"train_loop_config": {"lr": tune.grid_search([0.3, 0.03, 0.003, 0.0003])}},
                      tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1,
                                                  scheduler=ASHAScheduler(max_t=6, grace_period=1, reduction_factor=3)),
                      run_config=RunConfig(name=mode, storage_path=os.path.join(root, "runs"))).fit()
    print("EPOCHS " + json.dumps(sorted(r.metrics["training_iteration"] for r in grid)))
    best = grid.get_best_result()
    print(f"LOADED {fingerprint(TensorflowCheckpoint.get_model(best.checkpoint))}")
elif mode == "tune-fn":
    # Ray Tune's form: a function trainable of one process fitting a Keras model (Keras 3: no
    # TensorflowTrainer set Keras 2 up) with ray.tune.integration.keras's callback, under ASHA.
    from nestor.tune.integration.keras import TuneReportCheckpointCallback
    from nestor.tune.schedulers import ASHAScheduler

    def fit_fn(config):
        import keras

        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((len(columns),)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.SGD(config["lr"]), loss="binary_crossentropy", metrics=["accuracy"])
        model.fit(x.astype("float32"), y.astype("float32"), batch_size=64, epochs=6, verbose=0,
                  callbacks=[TuneReportCheckpointCallback(metrics={"mean_accuracy": "accuracy", "loss": "loss"})])
        print("KERAS " + keras.__version__, flush=True)

    grid = tune.Tuner(tune.with_resources(fit_fn, resources={"cpu": 1}), param_space={"lr": tune.grid_search([0.3, 0.1, 0.001, 0.0001])},
                      tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=ASHAScheduler(max_t=6, grace_period=1, reduction_factor=3)),
                      run_config=RunConfig(name=mode, storage_path=os.path.join(root, "runs"))).fit()
    print("EPOCHS " + json.dumps(sorted(r.metrics["training_iteration"] for r in grid)))
    print(f"ERRORS {sum(r.error is not None for r in grid)}")
    best = grid.get_best_result()
    print(f"BEST {best.metrics['mean_accuracy']}")
    model = TensorflowCheckpoint.get_model(best.checkpoint)
    print(f"LOADED {type(model).__module__.split('.')[0]} {fingerprint(model)}")
else:
    raise SystemExit(f"unknown mode {mode}")
