"""nestor.data for the tests (tests/tests/data.rs): files written here, a
TorchTrainer whose ranks read their shares.

Usage: data.py DIR MODE [ARGS]
  split WORKERS FORMAT SHUFFLE EPOCHS [SEED]  103 rows (ids 0..102) in 3 files of the FORMAT
                 (parquet in row groups of 10, csv, json); each rank logs the ids of each epoch
  resume NAME    4 shuffled epochs on 2 ranks, a checkpoint each, max_failures=1; $SLOW_S sleeps each batch
  s3 BUCKET URL  the split's files moved into the bucket's directory, read from URL (s3://bucket/...)
  whole          DataConfig(datasets_to_split=[]): every rank reads every row
  mapped         map_batches in the worker, iter_torch_batches with dtypes
  sources        from_pandas / from_numpy / from_items / from_huggingface, a DataLoader over each shard
  ddp            2 DDP ranks on 101 rows in uneven files, batch 8: the last step does not hang
  refuse WHAT    missing | schema | unreadable | notdataset: prints the ValueError
  subsets        train_test_split (in order, and shuffled with a seed), limit, repartition: the
                 driver prints what it counts (SUBSET lines), 2 ranks read train's halves and all of test
Rank log lines: RANK <json>. $PLACEMENT: the ScalingConfig's placement strategy (PACK).
"""

import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq

from nestor import data, train
from nestor.train import DataConfig, RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer

root, mode = sys.argv[1], sys.argv[2]
os.makedirs(root, exist_ok=True)


def write(fmt, sizes, name="rows"):
    """Files of ``sizes`` rows each, ids counting up across them."""
    folder = os.path.join(root, f"{name}-{fmt}")
    os.makedirs(folder, exist_ok=True)
    start = 0
    for i, n in enumerate(sizes):
        ids = np.arange(start, start + n, dtype=np.int64)
        table = pa.table({"id": ids, "x": ids.astype(np.float64) / 10})
        path = os.path.join(folder, f"part-{i}.{ 'jsonl' if fmt == 'json' else fmt}")
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=10)
        elif fmt == "csv":
            pyarrow.csv.write_csv(table, path)
        else:
            with open(path, "w") as f:
                for row in table.to_pylist():
                    f.write(json.dumps(row) + "\n")
        start += n
    return folder


def rank_line(**values):
    print("RANK " + json.dumps({"rank": train.get_context().get_world_rank(), **values}), flush=True)


def ids_loop(config):
    shard = train.get_dataset_shard("train")
    for epoch in range(config["epochs"]):
        ids = []
        for batch in shard.iter_batches(batch_size=8):
            ids += [int(i) for i in batch["id"]]
        rank_line(epoch=epoch, ids=ids, count=shard.count())
        train.report({"epoch": epoch + 1, "rows": len(ids)})


def fit(loop, config, datasets, workers=2, **kwargs):
    return TorchTrainer(loop, train_loop_config=config, datasets=datasets,
                        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.5},
                                                     placement_strategy=os.environ.get("PLACEMENT", "PACK")),
                        run_config=RunConfig(name=kwargs.pop("name", mode), storage_path=os.path.join(root, "runs")),
                        **kwargs).fit()


reader = {"parquet": data.read_parquet, "csv": data.read_csv, "json": data.read_json}

if mode == "split":
    workers, fmt, shuffle, epochs = int(sys.argv[3]), sys.argv[4], sys.argv[5] == "shuffle", int(sys.argv[6])
    seed = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    ds = reader[fmt](write(fmt, [37, 50, 16]))
    if shuffle:
        ds = ds.random_shuffle(seed=seed)
    fit(ids_loop, {"epochs": epochs}, {"train": ds}, workers=workers, name=f"split-{workers}-{fmt}-{sys.argv[5]}-{seed}")
elif mode == "resume":
    # 4 shuffled epochs on 2 ranks, a checkpoint each; $SLOW_S sleeps each batch; NAME names the run.
    def loop(config):
        import tempfile
        import time

        start = 0
        checkpoint = train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                start = int(open(os.path.join(d, "epoch")).read())
        rank_line(pid=os.getpid(), start=start)
        shard = train.get_dataset_shard("train")
        for epoch in range(start, 4):
            ids = []
            for batch in shard.iter_batches(batch_size=8):
                time.sleep(float(os.environ.get("SLOW_S", "0")))
                ids += [int(i) for i in batch["id"]]
            rank_line(epoch=epoch, ids=ids)
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "epoch"), "w") as f:
                    f.write(str(epoch + 1))
                train.report({"epoch": epoch + 1}, checkpoint=train.Checkpoint.from_directory(d))

    from nestor.train import FailureConfig

    ds = data.read_parquet(write("parquet", [37, 50, 16])).random_shuffle(seed=3)
    TorchTrainer(loop, datasets={"train": ds}, scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                 run_config=RunConfig(name=sys.argv[3], storage_path=os.path.join(root, "runs"),
                                      failure_config=FailureConfig(max_failures=1))).fit()
elif mode == "s3":
    # 103 rows in 3 Parquet files under the bucket's directory, read as s3://bucket/<glob or prefix> by 2 ranks.
    bucket_dir, url = sys.argv[3], sys.argv[4]
    folder = write("parquet", [37, 50, 16])
    os.makedirs(os.path.join(bucket_dir, "data"), exist_ok=True)
    for n in sorted(os.listdir(folder)):
        os.replace(os.path.join(folder, n), os.path.join(bucket_dir, "data", n))
    fit(ids_loop, {"epochs": 2}, {"train": data.read_parquet(url)})
elif mode == "whole":
    ds = data.read_parquet(write("parquet", [37, 50, 16]))
    fit(ids_loop, {"epochs": 1}, {"train": ds}, dataset_config=DataConfig(datasets_to_split=[]))
elif mode == "mapped":
    def loop(config):
        import torch

        for batch in train.get_dataset_shard("train").iter_torch_batches(batch_size=16, dtypes={"id": torch.int64, "y": torch.float32}):
            assert batch["y"].dtype == torch.float32 and batch["id"].dtype == torch.int64
            rank_line(ids=batch["id"].tolist(), ys=batch["y"].tolist())
        train.report({"done": 1})

    items = data.from_items([{"id": i, "x": float(i)} for i in range(40)])
    fit(loop, {}, {"train": items.map_batches(lambda b: {"id": b["id"], "y": b["x"] * 2 + 1})})
elif mode == "sources":
    # In-memory sources and a DataLoader over the shard: each rank's ids, once an epoch.
    import datasets as hf
    import pandas as pd

    def loop(config):
        import torch

        import nestor.train.torch

        for name in ("pandas", "numpy", "items", "huggingface"):
            shard = train.get_dataset_shard(name)
            loader = nestor.train.torch.prepare_data_loader(torch.utils.data.DataLoader(shard.to_torch(), batch_size=4))
            ids = [int(i) for batch in loader for i in batch["id"]]
            rank_line(source=name, ids=ids, count=shard.count())
        train.report({"done": 1})

    ids = np.arange(30)
    sources = {
        "pandas": data.from_pandas([pd.DataFrame({"id": ids[:10]}), pd.DataFrame({"id": ids[10:]})]),
        "numpy": data.from_numpy({"id": ids}),
        "items": data.from_items([{"id": int(i)} for i in ids]),
        "huggingface": data.from_huggingface(hf.Dataset.from_dict({"id": ids[::-1].tolist()}).select(range(30))),
    }
    fit(loop, {}, sources)
elif mode == "ddp":
    def loop(config):
        import torch

        import nestor.train.torch

        model = nestor.train.torch.prepare_model(torch.nn.Linear(1, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        shard = train.get_dataset_shard("train")
        for epoch in range(3):
            steps = 0
            for batch in shard.iter_torch_batches(batch_size=8):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(batch["x"].float().unsqueeze(1)), batch["x"].float().unsqueeze(1)).backward()
                opt.step()
                steps += 1
            rank_line(epoch=epoch, steps=steps)
            train.report({"epoch": epoch + 1, "steps": steps})

    fit(loop, {}, {"train": data.read_parquet(write("parquet", [60, 3, 38]))})
elif mode == "subsets":
    ds = data.read_parquet(write("parquet", [37, 50, 16])).repartition(4)
    ids = lambda d: sorted(r["id"] for r in d.take(200))  # noqa: E731
    train_part, test_part = ds.train_test_split(0.25)
    a, b = ds.train_test_split(25, shuffle=True, seed=5)
    again, _ = ds.train_test_split(25, shuffle=True, seed=5)
    other, _ = ds.train_test_split(25, shuffle=True, seed=6)
    print("SUBSET " + json.dumps({"train": ids(train_part), "test": ids(test_part), "a": ids(a), "b": ids(b), "again": ids(again),
                                  "other": ids(other), "limit": ids(ds.limit(10)), "counts": [a.count(), b.count()]}))
    try:
        ds.write_parquet("elsewhere")
    except AttributeError as e:
        print(f"MISSING {e}")

    def loop(config):
        for name in ("train", "test"):
            shard = train.get_dataset_shard(name)
            got = [int(i) for batch in shard.iter_batches(batch_size=8) for i in batch["id"]]
            rank_line(name=name, ids=got, count=shard.count())
        train.report({"done": 1})

    fit(loop, {}, {"train": a, "test": b.random_shuffle(seed=1)}, dataset_config=DataConfig(datasets_to_split=["train"]))
elif mode == "refuse":
    what = sys.argv[3]
    try:
        if what == "missing":
            fit(ids_loop, {"epochs": 1}, {"train": data.read_parquet(os.path.join(root, "nowhere.parquet"))})
        elif what == "schema":
            folder = write("parquet", [5, 5])
            pq.write_table(pa.table({"id": ["a", "b"]}), os.path.join(folder, "part-9.parquet"))
            fit(ids_loop, {"epochs": 1}, {"train": data.read_parquet(folder)})
        elif what == "unreadable":
            folder = write("parquet", [5])
            with open(os.path.join(folder, "part-5.parquet"), "w") as f:
                f.write("not parquet")
            fit(ids_loop, {"epochs": 1}, {"train": data.read_parquet(folder)})
        else:
            fit(ids_loop, {"epochs": 1}, {"train": [1, 2, 3]})
    except ValueError as e:
        print(f"REFUSED {e}")
        print("STORED " + json.dumps(sorted(os.listdir(os.path.join(root, "runs"))) if os.path.isdir(os.path.join(root, "runs")) else []))
else:
    sys.exit(f"unknown mode {mode}")
