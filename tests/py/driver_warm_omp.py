"""A TorchTrainer of 2 ranks whose training function runs parallel torch
operations on 2 threads. MODE ``clean``: the driver ran no torch operation,
and is forked as the warm process (its ranks are its grandchildren). MODE
``omp``: the driver ran one first, so OpenMP's threads are up; a fork of it
would wait for ever in its first parallel region, so the binary starts the
warm process, and the ranks' operations finish.
Usage: driver_warm_omp.py STORAGE clean|omp   Prints FORKED n (ranks forked from the driver's fork)."""

import os
import sys

import torch

from nestor import train
from nestor.train import RunConfig, ScalingConfig
from nestor.train.torch import TorchTrainer

STORAGE, MODE = sys.argv[1], sys.argv[2]


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def work():
    a = torch.randn(768, 768)
    return float((a @ a).sum() + torch.randn(1 << 21).exp().sum())


def loop(config):
    torch.set_num_threads(2)
    work()
    train.report({"from_driver": int(parent_of(os.getppid()) == config["driver"]), "threads": torch.get_num_threads()})


if MODE == "omp":
    work()
result = TorchTrainer(
    loop,
    train_loop_config={"driver": os.getpid()},
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(name=f"omp-{MODE}", storage_path=STORAGE),
).fit()
assert result.error is None, result.error
print("FORKED", int(result.metrics["from_driver"]))
print("THREADS", int(result.metrics["threads"]))
