"""A Python rank of an experiment file's sweep that reads its share of
``[datasets]`` (tests/tests/data_toml.rs): the fixture worker's `dataset`
mode, in Python (the plain worker client, and ``nestor.train``'s shard).
Prints ``RANK {"rank", "epoch", "ids", "count"}``."""

import json

import nestor
from nestor.train import get_dataset_shard

ctx = nestor.get_context()
config = nestor.get_config()
shard = get_dataset_shard(config["dataset"])
for epoch in range(ctx.start_iteration, config["steps"]):
    ids = []
    for batch in shard.iter_batches(batch_size=8):
        ids += [int(i) for i in batch["id"]]
    print("RANK " + json.dumps({"rank": ctx.world_rank, "epoch": epoch, "ids": ids, "count": shard.count()}), flush=True)
    nestor.report({"epoch": epoch + 1, "rows": len(ids)})
