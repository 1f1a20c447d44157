"""PyTorch data parallelism for nestor workers (Ray Train's
``ray.train.torch``): the process group from nestor's environment, device
placement, DistributedDataParallel and DistributedSampler."""

import datetime
import os
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from . import _contract, get_context

__all__ = ["accelerate", "backward", "enable_reproducibility", "get_device", "get_devices", "init_process_group", "prepare_model",
           "prepare_data_loader", "prepare_optimizer"]


def get_device() -> torch.device:
    """This worker's device: its first GPU (``CUDA_VISIBLE_DEVICES`` holds just
    its bundle's GPUs, so that is ``cuda:0``), or the CPU."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "") != "" and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def get_devices() -> List[torch.device]:
    """All of this worker's devices: each GPU of its bundle, or the CPU."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "") != "" and torch.cuda.is_available():
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [torch.device("cpu")]


def enable_reproducibility(seed: int = 0) -> None:
    """Seeds Python, NumPy (when present) and torch, and asks torch for
    deterministic algorithms (Ray's helper of the same name)."""
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def init_process_group(always: bool = False, _group: Any = None) -> None:
    """Joins the trial's process group, with the backend and timeout nestor was
    configured with (``TorchConfig``), as the run's plan says: through a file
    when nestor gives one, through the driver where the nodes share no file,
    else at ``MASTER_ADDR``/``MASTER_PORT``.
    A no-op when already joined, and with one worker unless ``always``
    (a ``TorchTrainer`` joins before its training function runs, whatever the
    number of workers, as Ray Train does: one rank meets itself in memory).
    ``TorchTrainer``'s backend passes its worker group: across nodes, rank 0's
    store address then goes to the others through the group's exchange."""
    ctx = get_context()
    if not dist.is_available() or dist.is_initialized() or (ctx.world_size <= 1 and not always):
        return
    device = get_device()
    plan = _contract.plan()
    backend = (plan.torch_backend if plan else "") or ("nccl" if device.type == "cuda" else "gloo")
    timeout = datetime.timedelta(seconds=plan.collective_timeout_s if plan else 1800.0)
    meet = plan.meet if plan else {"kind": "master"}
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if ctx.world_size <= 1:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return
    # nestor names a fresh file per launch when all ranks share a node: a file
    # store meets at once, where the TCP store's clients back off (up to about
    # half a second) when they come before rank 0 listens.
    if meet.get("kind") == "driver":
        # Nodes that share no file: rank 0's TCP store on a port free on its
        # node, its address passed to the others through the driver.
        store = _store_through_group(_group, timeout) if _group is not None else _store_through_driver(ctx, timeout)
        dist.init_process_group(backend=backend, store=store, rank=ctx.world_rank, world_size=ctx.world_size, timeout=timeout)
        return
    init_method = f"file://{meet['path']}" if meet.get("kind") == "file" else "env://"
    dist.init_process_group(backend=backend, init_method=init_method, rank=ctx.world_rank, world_size=ctx.world_size, timeout=timeout)


def _store_through_driver(ctx, timeout: datetime.timedelta):
    from . import _get_channel

    channel = _get_channel()
    if ctx.world_rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, ctx.world_size, True, timeout=timeout, wait_for_workers=False)
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        channel.rendezvous(ctx, f"{host}:{store.port}", timeout.total_seconds())
        return store
    address = channel.rendezvous(ctx, "", timeout.total_seconds())
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host, int(port), ctx.world_size, False, timeout=timeout)


def _store_through_group(group: Any, timeout: datetime.timedelta):
    """Rank 0's TCP store on a port free on its node, its address passed to
    the other ranks by the backend's worker group (nestor.train.backend)."""
    store = dist.TCPStore("0.0.0.0", 0, group.world_size, True, timeout=timeout, wait_for_workers=False) if group.rank == 0 else None
    address = group.broadcast_from_rank_zero(f"{group.node_ip}:{store.port}" if store is not None else None)
    if store is not None:
        return store
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host, int(port), group.world_size, False, timeout=timeout)


def prepare_model(model: torch.nn.Module, move_to_device: bool = True, parallel_strategy: Optional[str] = "ddp",
                  parallel_strategy_kwargs: Optional[Dict[str, Any]] = None, **ddp_kwargs: Any):
    """Moves ``model`` to this worker's device and, with several workers,
    makes it data-parallel across the trial (joining the process group
    first), as Ray's ``prepare_model``:

    - ``"ddp"``: ``DistributedDataParallel(model, **parallel_strategy_kwargs)``;
    - ``"fsdp"``: sharded, each rank holding its part of every parameter:
      ``FullyShardedDataParallel(model, **parallel_strategy_kwargs)`` on a
      GPU; on CPUs, where that class refuses to run, ``fully_shard`` (FSDP2)
      over all the ranks, the model returned in place, its parameters
      ``DTensor`` shards (``torch.distributed.checkpoint`` saves and loads them);
    - ``None``: the model as it is.
    """
    if parallel_strategy not in ("ddp", "fsdp", None):
        raise ValueError(f"prepare_model(parallel_strategy={parallel_strategy!r}): give 'ddp', 'fsdp' or None")
    kwargs = dict(parallel_strategy_kwargs or {})
    kwargs.update(ddp_kwargs)  # Ray's older keyword arguments, for DDP
    init_process_group()
    device = get_device()
    if move_to_device:
        model = model.to(device)
    if parallel_strategy is None or get_context().world_size <= 1:
        return model
    if parallel_strategy == "ddp":
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device])
        return torch.nn.parallel.DistributedDataParallel(model, **kwargs)
    if device.type == "cuda":
        from torch.distributed.fsdp import FullyShardedDataParallel

        kwargs.setdefault("device_id", device)
        return FullyShardedDataParallel(model, **kwargs)
    return _fully_shard_on_cpu(model, kwargs)


def _fully_shard_on_cpu(model: torch.nn.Module, kwargs: Dict[str, Any]) -> torch.nn.Module:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        raise RuntimeError(f"prepare_model(parallel_strategy='fsdp') on CPUs needs torch >= 2.6 (fully_shard); this is {torch.__version__}") from None
    from torch.distributed.device_mesh import init_device_mesh

    kwargs.setdefault("mesh", init_device_mesh("cpu", (dist.get_world_size(),)))
    # Each parameterised child its own group (gathered in turn, not all at once), then the rest.
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        moved = [_to_device(b, device) for b in batch]
        return type(batch)(moved) if not hasattr(batch, "_fields") else type(batch)(*moved)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


class _DeviceLoader:
    """A DataLoader whose batches arrive on the device, and whose distributed
    sampler moves to the next epoch at each pass. Passes are counted from the
    iterations already done, so a restarted run shuffles as the uninterrupted
    one would have (one pass per reported iteration). With ``auto_transfer``
    on a GPU, the next batch is copied to the device on a stream of its own
    while the current one is used (Ray's ``auto_transfer``)."""

    def __init__(self, loader: DataLoader, device: torch.device, auto_transfer: bool = True):
        self.loader = loader
        self.device = device
        self._epoch = get_context().start_iteration
        self._stream = torch.cuda.Stream(device) if auto_transfer and device.type == "cuda" else None

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __iter__(self):
        sampler = self.loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(self._epoch)
        self._epoch += 1
        if self._stream is None:
            for batch in self.loader:
                yield _to_device(batch, self.device)
            return
        # One batch ahead: its copy overlaps the step on the current one.
        pending = None
        for batch in self.loader:
            with torch.cuda.stream(self._stream):
                moved = _to_device(batch, self.device)
            if pending is not None:
                yield pending
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
            pending = moved
        if pending is not None:
            yield pending


def _rebuilt(loader: DataLoader, sampler: DistributedSampler) -> DataLoader:
    """``loader`` with ``sampler`` in place of its own, every other option
    of the one given kept (workers, prefetching, pinning, the worker
    context, ...)."""
    kwargs: Dict[str, Any] = dict(
        batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, drop_last=loader.drop_last, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        generator=loader.generator, multiprocessing_context=loader.multiprocessing_context,
    )
    if loader.num_workers > 0:
        kwargs.update(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
    for name in ("pin_memory_device", "in_order"):  # torch's newer options, where this torch has them
        if hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
    return DataLoader(loader.dataset, **kwargs)


def prepare_data_loader(loader: DataLoader, add_dist_sampler: bool = True, move_to_device: bool = True, auto_transfer: bool = True):
    """With several workers, rebuilds ``loader`` with a DistributedSampler (each
    rank gets its own shard; shuffling kept if the loader shuffled; every
    other option of the loader kept), and moves every batch to this
    worker's device (on a GPU, the next one while the current one is used:
    ``auto_transfer``)."""
    ctx = get_context()
    iterable = isinstance(loader.dataset, torch.utils.data.IterableDataset)
    # An IterableDataset has no sampler to shard: it yields its own share
    # (get_dataset_shard(...).to_torch() does), as in Ray. A loader given a
    # batch_sampler of its own (batch_size None) shards as that sampler says.
    if (add_dist_sampler and ctx.world_size > 1 and not iterable and loader.batch_size is not None
            and not isinstance(loader.sampler, DistributedSampler)):
        init_process_group()
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler = DistributedSampler(loader.dataset, num_replicas=ctx.world_size, rank=ctx.world_rank, shuffle=shuffle)
        loader = _rebuilt(loader, sampler)
    if move_to_device:
        return _DeviceLoader(loader, get_device(), auto_transfer)
    return loader


def accelerate(amp: bool = False) -> None:
    """Ray's ``accelerate``: with ``amp=True`` Ray wraps models and optimizers
    for mixed precision. nestor does not: use ``torch.autocast`` and
    ``torch.amp.GradScaler`` in the training function (they work unchanged)."""
    if amp:
        raise NotImplementedError("ray.train.torch.accelerate(amp=True) is not in nestor: use torch.autocast and "
                                  "torch.amp.GradScaler in the training function")


def prepare_optimizer(optimizer: Any) -> Any:
    """Ray's ``prepare_optimizer``: the optimizer as it is (it only mattered
    under ``accelerate(amp=True)``)."""
    return optimizer


def backward(tensor: Any) -> None:
    """Ray's ``backward``: ``tensor.backward()``."""
    tensor.backward()

