"""Ray Data's training surface in the shapes of Ray's own examples and user
guides, run for real with their imports changed.

Usage: ray_data_train.py STORAGE SCENARIO
  transforms    the "transforming data" guide's row transforms before fit(), a
                preprocessor fitted on the driver and saved in metadata, each
                rank's share checked against the driver's own transform
  xgboost       Ray's XGBoost quickstart: get_dataset_shard(...).materialize().to_pandas()
  lightgbm      LightGBMTrainer's older form: params=, label_column=, datasets=
  ingest        a custom DataConfig.configure (Ray's custom ingest guide) and read_text / read_numpy / read_images
Prints ``OUT {...}``.
"""

import json
import os
import sys

import numpy as np
import pandas as pd

import nestor.data as rd
from nestor import train
from nestor.data.preprocessors import Chain, Concatenator, SimpleImputer, StandardScaler
from nestor.train import DataConfig, RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer

ROWS = 600


def frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    x1, x2 = rng.normal(3.0, 2.0, ROWS), rng.normal(-1.0, 0.5, ROWS)
    x2[::10] = np.nan  # gaps for the imputer
    return pd.DataFrame({"id": np.arange(ROWS), "x1": x1, "x2": x2, "kind": np.where(np.arange(ROWS) % 3 == 0, "a", "b"),
                         "y": 2 * x1 + 1})


def transforms(storage: str) -> dict:
    ds = rd.from_pandas(frame())
    # The guide's row transforms: where each runs is nestor's business, the rows are the same.
    ds = ds.filter(lambda row: row["kind"] == "b")
    ds = ds.map(lambda row: {**row, "x1_squared": row["x1"] ** 2})
    ds = ds.add_column("double_y", lambda df: df["y"] * 2)
    ds = ds.drop_columns(["kind"]).rename_columns({"double_y": "y2"})
    preprocessor = Chain(SimpleImputer(["x2"], strategy="mean"), StandardScaler(["x1", "x2"]),
                         Concatenator(["x1", "x2"], output_column_name="features", dtype=np.float32))
    ds = preprocessor.fit_transform(ds)
    expected = ds.to_pandas()  # the driver's own reading of the whole thing
    out_dir = os.path.join(storage, "shares")
    os.makedirs(out_dir, exist_ok=True)

    def loop(config):
        ctx = train.get_context()
        shard = train.get_dataset_shard("train")
        rows = []
        for epoch in range(2):
            seen = []
            for batch in shard.iter_batches(batch_size=64, batch_format="pandas"):
                seen += [{"id": int(r.id), "features": [float(v) for v in r.features], "x1_squared": float(r.x1_squared),
                          "y2": float(r.y2)} for r in batch.itertuples()]
            rows.append(seen)
        with open(os.path.join(config["out"], f"rank-{ctx.get_world_rank()}.json"), "w") as f:
            json.dump({"epochs": rows, "metadata_keys": sorted(ctx.get_metadata())}, f)
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "model.txt"), "w") as f:
                f.write("weights")
            train.report({"rows": float(len(rows[0]))}, checkpoint=train.Checkpoint.from_directory(d))

    result = TorchTrainer(loop, train_loop_config={"out": out_dir}, scaling_config=ScalingConfig(num_workers=2),
                          datasets={"train": ds}, metadata={"preprocessor_pkl": preprocessor.serialize()},
                          run_config=RunConfig(name="transforms", storage_path=storage)).fit()
    shares = {}
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            shares[name] = json.load(f)
    restored = rd.preprocessors.Preprocessor.deserialize(result.checkpoint.get_metadata()["preprocessor_pkl"])
    by_id = {int(r.id): r for r in expected.itertuples()}
    mismatched = 0
    for share in shares.values():
        for epoch in share["epochs"]:
            for row in epoch:
                want = by_id[row["id"]]
                if not np.allclose(row["features"], want.features, atol=1e-5) or abs(row["y2"] - want.y2) > 1e-9:
                    mismatched += 1
    return {"expected_rows": len(expected), "share_rows": {k: [len(e) for e in v["epochs"]] for k, v in shares.items()},
            "ids_per_epoch": [len({r["id"] for s in shares.values() for r in s["epochs"][e]}) for e in range(2)],
            "mismatched": mismatched, "metadata_keys": [s["metadata_keys"] for s in shares.values()],
            "restored_stats": sorted(restored.preprocessors[1].stats_), "checkpoint": result.checkpoint.path}


def xgboost_quickstart(storage: str) -> dict:
    import xgboost

    from nestor.train.xgboost import RayTrainReportCallback, XGBoostTrainer

    df = frame().drop(columns=["kind", "x2"])
    train_ds, eval_ds = rd.from_pandas(df).train_test_split(0.3)

    def train_func():
        # Ray's quickstart: each rank's share, materialized, as pandas.
        train_df = train.get_dataset_shard("train").materialize().to_pandas()
        eval_df = train.get_dataset_shard("validation").materialize().to_pandas()
        dtrain = xgboost.DMatrix(train_df.drop(columns=["y"]), label=train_df["y"])
        deval = xgboost.DMatrix(eval_df.drop(columns=["y"]), label=eval_df["y"])
        xgboost.train({"objective": "reg:squarederror", "eval_metric": ["rmse"], "tree_method": "hist"}, dtrain=dtrain,
                      evals=[(dtrain, "train"), (deval, "validation")], num_boost_round=10, callbacks=[RayTrainReportCallback()])

    result = XGBoostTrainer(train_func, scaling_config=ScalingConfig(num_workers=2),
                            datasets={"train": train_ds, "validation": eval_ds},
                            run_config=RunConfig(name="xgb", storage_path=storage)).fit()
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    return {"rounds": booster.num_boosted_rounds(), "validation-rmse": result.metrics["validation-rmse"],
            "iterations": result.metrics["training_iteration"]}


def lightgbm_older_form(storage: str) -> dict:
    from nestor.train.lightgbm import LightGBMTrainer

    df = frame().drop(columns=["kind", "x2", "id"])
    train_ds, valid_ds = rd.from_pandas(df).train_test_split(0.25)
    result = LightGBMTrainer(params={"objective": "regression", "metric": "l2", "verbose": -1, "min_data_in_leaf": 5},
                             label_column="y", num_boost_round=8, scaling_config=ScalingConfig(num_workers=2),
                             datasets={"train": train_ds, "valid": valid_ds},
                             run_config=RunConfig(name="lgbm", storage_path=storage)).fit()
    booster = LightGBMTrainer.get_model(result.checkpoint)
    return {"rounds": booster.current_iteration(), "metrics": sorted(k for k in result.metrics if "l2" in k),
            "iterations": result.metrics["training_iteration"]}


def xgboost_tuned(storage: str) -> dict:
    """Ray's Train user guide's Tuner over an older-form XGBoostTrainer: the
    trial's "params" merged into the trainer's, its "num_boost_round" in
    place of the trainer's, its ScalingConfig's num_workers from a grid."""
    from nestor import tune
    from nestor.train.xgboost import XGBoostTrainer

    df = frame().drop(columns=["kind", "x2"])
    # A label with noise deep trees would chase (the trainer's max_depth 4 would grow them).
    noise = np.random.default_rng(3).random(len(df)) < 0.2
    df["y"] = ((df["x1"] > 3) ^ (df["id"] % 2 == 0) ^ noise).astype(int)
    trainer = XGBoostTrainer(label_column="y", params={"objective": "binary:logistic", "eval_metric": ["logloss", "error"],
                                                        "max_depth": 4}, num_boost_round=10, datasets={"train": rd.from_pandas(df)})
    grid = tune.Tuner(trainer, param_space={"num_boost_round": tune.grid_search([3, 7]), "params": {"max_depth": tune.randint(1, 3)},
                                            "scaling_config": ScalingConfig(num_workers=tune.grid_search([1, 2]))},
                      tune_config=tune.TuneConfig(mode="min", metric="train-logloss", max_concurrent_trials=1),
                      run_config=RunConfig(name="xgb-tuned", storage_path=storage)).fit()
    out = []
    for r in grid:
        booster = XGBoostTrainer.get_model(r.checkpoint)
        # The deepest node of any tree (a dump indents each node by its depth).
        depth = max(len(line) - len(line.lstrip("\t")) for tree in booster.get_dump() for line in tree.splitlines())
        out.append({"rounds": booster.num_boosted_rounds(), "asked": r.config["num_boost_round"], "depth": int(depth),
                    "asked_depth": r.config["params"]["max_depth"], "error": str(r.error) if r.error else None})
    return {"trials": out}


def huggingface(storage: str) -> dict:
    """Ray's Hugging Face pattern: the Trainer's train_dataset is the rank's
    shard's iter_torch_batches(), fed by prepare_trainer, max_steps set."""
    import torch

    rows = []
    for i in range(256):
        ids = [(i + j) % 64 for j in range(16)]
        rows.append({"input_ids": ids, "labels": ids, "row": i})
    out_dir = os.path.join(storage, "hf-out")
    os.makedirs(out_dir, exist_ok=True)

    def loop(config):
        import transformers

        from nestor.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

        seen = []

        def collate(batch):
            seen.extend(int(r) for r in batch["row"])
            return {"input_ids": torch.as_tensor(batch["input_ids"]), "labels": torch.as_tensor(batch["labels"])}

        shard = train.get_dataset_shard("train")
        transformers.set_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                                                     n_head=2, bos_token_id=0, eos_token_id=0))
        args = transformers.TrainingArguments(output_dir="hf-output", per_device_train_batch_size=8, max_steps=20,
                                              save_strategy="steps", save_steps=10, logging_steps=10, report_to=[],
                                              use_cpu=True, disable_tqdm=True, seed=0)
        trainer = transformers.Trainer(model=model, args=args,
                                       train_dataset=shard.iter_torch_batches(batch_size=8, collate_fn=collate))
        trainer.add_callback(RayTrainReportCallback())
        prepare_trainer(trainer).train()
        with open(os.path.join(config["out"], f"rank-{train.get_context().get_world_rank()}.json"), "w") as f:
            json.dump({"rows": seen}, f)

    result = TorchTrainer(loop, train_loop_config={"out": out_dir}, scaling_config=ScalingConfig(num_workers=2),
                          datasets={"train": rd.from_items(rows)}, run_config=RunConfig(name="hf", storage_path=storage)).fit()
    seen = {}
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            seen[name] = json.load(f)["rows"]
    return {"steps": result.metrics.get("step"), "loss": result.metrics.get("loss"), "checkpoint": result.checkpoint is not None,
            "rows": {k: len(v) for k, v in seen.items()}, "overlap": len(set(seen["rank-0.json"]) & set(seen["rank-1.json"])),
            "distinct": len(set(seen["rank-0.json"]) | set(seen["rank-1.json"]))}


class SplitOneWholeOther(DataConfig):
    """Ray's custom ingest: "train" cut into equal shares, "lookup" whole on every rank."""

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        shares = datasets["train"].streaming_split(world_size, equal=True)
        return [{"train": shares[rank], "lookup": datasets["lookup"]} for rank in range(world_size)]


def ingest(storage: str) -> dict:
    from PIL import Image

    data = os.path.join(storage, "files")
    os.makedirs(os.path.join(data, "images"), exist_ok=True)
    with open(os.path.join(data, "lines.txt"), "w") as f:
        f.write("".join(f"line {i}\n" for i in range(40)))
    np.save(os.path.join(data, "arrays.npy"), np.arange(24 * 6, dtype=np.float32).reshape(24, 2, 3))
    for i in range(6):
        Image.fromarray(np.full((10, 8, 3), i * 10, dtype=np.uint8)).save(os.path.join(data, "images", f"{i}.png"))
    ctx = rd.DataContext.get_current()
    ctx.execution_options = DataConfig.default_ingest_options()
    ctx.execution_options.preserve_order = True
    out_dir = os.path.join(storage, "ingest-out")
    os.makedirs(out_dir, exist_ok=True)

    def loop(config):
        rank = train.get_context().get_world_rank()
        lines = [r["text"] for r in train.get_dataset_shard("train").iter_rows()]
        lookup = train.get_dataset_shard("lookup").materialize().to_pandas()
        got = {"lines": lines, "lookup": len(lookup)}
        if config.get("files"):
            arrays = next(iter(train.get_dataset_shard("arrays").iter_batches(batch_size=100)))["data"]
            images = next(iter(train.get_dataset_shard("images").iter_torch_batches(batch_size=100)))["image"]
            got.update(arrays=list(arrays.shape), images=list(images.shape),
                       image_values=sorted({int(v) for v in images.flatten().tolist()}))
        with open(os.path.join(config["out"], f"rank-{rank}.json"), "w") as f:
            json.dump(got, f)
        train.report({"lines": float(len(lines))})

    datasets = {"train": rd.read_text(os.path.join(data, "lines.txt")),
                "lookup": rd.from_items([{"k": i} for i in range(5)]).sort("k", descending=True)}
    TorchTrainer(loop, train_loop_config={"out": out_dir}, scaling_config=ScalingConfig(num_workers=2), datasets=datasets,
                 dataset_config=SplitOneWholeOther(), run_config=RunConfig(name="ingest", storage_path=storage)).fit()
    custom = {}
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            custom[name] = json.load(f)
    os.makedirs(os.path.join(storage, "ingest2-out"), exist_ok=True)
    TorchTrainer(loop, train_loop_config={"out": os.path.join(storage, "ingest2-out"), "files": True}, scaling_config=ScalingConfig(num_workers=2),
                 datasets={**datasets, "arrays": rd.read_numpy(os.path.join(data, "arrays.npy")),
                           "images": rd.read_images(os.path.join(data, "images"), size=(4, 4), mode="L")},
                 dataset_config=DataConfig(datasets_to_split=["train", "arrays", "images"]),
                 run_config=RunConfig(name="ingest2", storage_path=storage)).fit()
    plain = {}
    for name in sorted(os.listdir(os.path.join(storage, "ingest2-out"))):
        with open(os.path.join(storage, "ingest2-out", name)) as f:
            plain[name] = json.load(f)
    return {"custom": {k: {"lines": len(v["lines"]), "first": v["lines"][:1], "lookup": v["lookup"]} for k, v in custom.items()},
            "all_lines": sorted({line for v in custom.values() for line in v["lines"]}) == sorted(f"line {i}" for i in range(40)),
            "plain": {k: {"arrays": v["arrays"], "images": v["images"], "image_values": v["image_values"]} for k, v in plain.items()}}


def main():
    storage, scenario = sys.argv[1], sys.argv[2]
    out = {"transforms": transforms, "xgboost": xgboost_quickstart, "lightgbm": lightgbm_older_form, "ingest": ingest,
           "xgboost-tuned": xgboost_tuned, "huggingface": huggingface}[scenario](storage)
    print("OUT " + json.dumps(out))


if __name__ == "__main__":
    main()
