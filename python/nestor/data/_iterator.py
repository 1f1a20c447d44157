"""A worker's share of a data set (Ray's ``DataIterator``): each pass over
``iter_batches()`` (and the other iterators) is the next epoch, read in
the background."""

import queue
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from ._blocks import _apply, _Plan, _read_block, _to_format
from ._split import permutation, rows_per_rank, share

_END = object()


class _Epochs:
    """What ``iter_batches()`` and the like return, as Ray's do: an iterable
    whose every pass (a ``for`` loop, a ``DataLoader`` epoch, a Hugging
    Face ``Trainer`` epoch) reads the next epoch of this rank's share."""

    def __init__(self, start: Callable[[], Iterator[Any]]):
        self._start = start

    def __iter__(self) -> Iterator[Any]:
        return iter(self._start())


class _Share:
    """This rank's rows of one data set, epoch after epoch: the reading of
    ``nestor.data.DataIterator`` (which adds what needs the data sets)."""

    def __init__(self, plan: _Plan, rank: int, world: int, epoch: int = 0):
        self._plan, self._rank, self._world = plan, rank, world
        #: The next epoch to read (a restarted run goes on at its checkpoint's).
        self.epoch = epoch

    def count(self) -> int:
        """How many rows this rank reads an epoch (the same on every rank)."""
        return rows_per_rank(self._plan.rows, self._world, self._plan.split)

    def _tables(self, epoch: int, prefetch: int) -> Iterator[Any]:
        """The epoch's pieces, read and mapped by a thread ahead of the consumer."""
        plan = self._plan
        pieces = share([b.rows for b in plan.blocks], self._world, self._rank, epoch, plan.seed, plan.shuffle, plan.split)
        out: "queue.Queue[Any]" = queue.Queue(maxsize=max(1, prefetch))
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            cached = (None, None)
            try:
                for b, lo, hi in pieces:
                    if cached[0] != b:
                        table = _read_block(plan.blocks[b])
                        if plan.shuffle:
                            table = table.take(permutation(table.num_rows, plan.seed, epoch, b))
                        cached = (b, table)
                    if not put(_apply(cached[1].slice(lo, hi - lo), plan.transforms)):
                        return
            except BaseException as e:  # the consumer raises it
                put(e)
                return
            put(_END)

        thread = threading.Thread(target=produce, name=f"nestor-data-{plan.name}", daemon=True)
        thread.start()
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()

    def iter_batches(self, *, batch_size: Optional[int] = 256, batch_format: str = "numpy", drop_last: bool = False,
                     prefetch_batches: int = 1, local_shuffle_buffer_size: Optional[int] = None,
                     local_shuffle_seed: Optional[int] = None, **_ignored: Any) -> Iterator[Any]:
        """The next epoch's rows in batches of ``batch_size`` (None: as read),
        as dicts of NumPy arrays, pandas DataFrames or pyarrow Tables; with
        ``local_shuffle_buffer_size``, drawn at random from that many rows."""
        if batch_format not in ("numpy", "pandas", "pyarrow", "default"):
            raise ValueError(f"iter_batches(batch_format={batch_format!r}): give 'numpy', 'pandas' or 'pyarrow'")
        fmt = "numpy" if batch_format == "default" else batch_format
        return _Epochs(lambda: self._batches(self._next_epoch(), batch_size, fmt, drop_last, prefetch_batches,
                                             local_shuffle_buffer_size, local_shuffle_seed))

    def _next_epoch(self) -> int:
        epoch = self.epoch
        self.epoch += 1
        return epoch

    def _batches(self, epoch: int, batch_size: Optional[int], fmt: str, drop_last: bool, prefetch: int,
                 buffer_rows: Optional[int], buffer_seed: Optional[int]) -> Iterator[Any]:
        import pyarrow as pa

        rng = None
        if buffer_rows:
            import numpy as np

            rng = np.random.default_rng([buffer_seed if buffer_seed is not None else self._plan.seed, epoch, self._rank])
        pending: list = []
        held = 0
        for table in self._tables(epoch, prefetch):
            if batch_size is None:
                yield _to_format(table, fmt)
                continue
            pending.append(table)
            held += table.num_rows
            need = batch_size + (buffer_rows or 0)
            while held >= need:
                buf = pa.concat_tables(pending)
                batch, rest = _cut(buf, batch_size, rng)
                pending, held = [rest], rest.num_rows
                yield _to_format(batch, fmt)
        if batch_size is None or held == 0:
            return
        buf = pa.concat_tables(pending)
        while buf.num_rows >= batch_size:
            batch, buf = _cut(buf, batch_size, rng)
            yield _to_format(batch, fmt)
        if buf.num_rows and not drop_last:
            yield _to_format(buf if rng is None else buf.take(rng.permutation(buf.num_rows)), fmt)

    def iter_torch_batches(self, *, batch_size: Optional[int] = 256, dtypes: Any = None, device: Any = "auto",
                           collate_fn: Optional[Callable[[Dict[str, Any]], Any]] = None, drop_last: bool = False,
                           prefetch_batches: int = 1, local_shuffle_buffer_size: Optional[int] = None,
                           local_shuffle_seed: Optional[int] = None, **_ignored: Any) -> Iterator[Any]:
        """The next epoch's batches as dicts of torch tensors on this
        worker's device (``device="auto"``), cast to ``dtypes`` (one dtype, or
        a dict by column); ``collate_fn`` turns each NumPy batch into
        whatever it returns instead."""
        import torch

        if device == "auto":
            from .. import torch as nestor_torch

            device = nestor_torch.get_device()
        batches = self.iter_batches(batch_size=batch_size, batch_format="numpy", drop_last=drop_last,
                                    prefetch_batches=prefetch_batches, local_shuffle_buffer_size=local_shuffle_buffer_size,
                                    local_shuffle_seed=local_shuffle_seed)

        def epoch() -> Iterator[Any]:
            for batch in batches:
                if collate_fn is not None:
                    yield collate_fn(batch)
                    continue
                out = {}
                for name, values in batch.items():
                    dtype = dtypes.get(name) if isinstance(dtypes, dict) else dtypes
                    out[name] = torch.as_tensor(values, dtype=dtype, device=device)
                yield out

        return _Epochs(epoch)

    def stats(self) -> str:
        return f"{self!r}: read straight from the files (no execution statistics)"

    def iter_rows(self, **kwargs: Any) -> Iterator[Dict[str, Any]]:
        """The next epoch's rows, one dict each (each pass over it the next epoch)."""
        batches = self.iter_batches(batch_format="pyarrow", **kwargs)

        def epoch() -> Iterator[Dict[str, Any]]:
            for table in batches:
                yield from table.to_pylist()

        return _Epochs(epoch)

    def to_torch(self, **kwargs: Any) -> "torch.utils.data.IterableDataset":  # noqa: F821
        """This share as a torch ``IterableDataset`` of rows (one epoch per
        iteration), for a ``DataLoader`` or a Hugging Face ``Trainer``."""
        import torch

        it = self

        class _Rows(torch.utils.data.IterableDataset):
            def __len__(self) -> int:
                return it.count()

            def __iter__(self) -> Iterator[Dict[str, Any]]:
                return iter(it.iter_rows(**kwargs))

        return _Rows()

    def to_tf(self, feature_columns: Union[str, List[str]], label_columns: Optional[Union[str, List[str]]] = None, *,
              additional_columns: Optional[Union[str, List[str]]] = None, prefetch_batches: int = 1, batch_size: int = 1,
              drop_last: bool = False, local_shuffle_buffer_size: Optional[int] = None, local_shuffle_seed: Optional[int] = None,
              feature_type_spec: Any = None, label_type_spec: Any = None, additional_type_spec: Any = None) -> Any:
        """This share as a ``tf.data.Dataset`` of ``(features, labels)``
        batches (features alone without ``label_columns``; a third part with
        ``additional_columns``): a column name gives a tensor, a list of
        names a dict of tensors. Each pass over it (each epoch of
        ``model.fit``) is the next epoch. Wrap it in
        ``nestor.train.tensorflow.prepare_dataset_shard`` under a
        multi-worker strategy."""
        import numpy as np
        import tensorflow as tf

        parts = [(feature_columns, feature_type_spec)]
        if label_columns is not None:
            parts.append((label_columns, label_type_spec))
        if additional_columns is not None:
            parts.append((additional_columns, additional_type_spec))
        for cols, _ in parts:
            names = [cols] if isinstance(cols, str) else list(cols)
            if not names or not all(isinstance(c, str) for c in names):
                raise ValueError(f"to_tf: columns are a name or a list of names, not {cols!r}")

        def pick(batch: Dict[str, Any], cols: Union[str, List[str]]) -> Any:
            missing = [c for c in ([cols] if isinstance(cols, str) else cols) if c not in batch]
            if missing:
                raise ValueError(f"to_tf: {self._plan.name!r} has no column {missing[0]!r} (it has {', '.join(batch)})")
            return batch[cols] if isinstance(cols, str) else {c: batch[c] for c in cols}

        def spec(values: Any) -> Any:
            a = np.asarray(values)
            dtype = tf.string if a.dtype.kind in "OUS" else tf.as_dtype(a.dtype)
            return tf.TensorSpec(shape=(None,) + a.shape[1:], dtype=dtype)

        signature = [given for _, given in parts]
        if any(s is None for s in signature):
            # The types from the first batch of the next epoch (read, not consumed: the epoch is read again in full).
            first = next(iter(self._batches(self.epoch, batch_size, "numpy", False, 1, None, None)), None)
            if first is None:
                raise ValueError(f"to_tf: {self._plan.name!r} has no rows on this rank")
            for i, (cols, given) in enumerate(parts):
                if given is None:
                    picked = pick(first, cols)
                    signature[i] = spec(picked) if isinstance(cols, str) else {c: spec(v) for c, v in picked.items()}

        def batches() -> Iterator[Any]:
            for batch in self.iter_batches(batch_size=batch_size, drop_last=drop_last, prefetch_batches=prefetch_batches,
                                           local_shuffle_buffer_size=local_shuffle_buffer_size, local_shuffle_seed=local_shuffle_seed):
                out = tuple(pick(batch, cols) for cols, _ in parts)
                yield out if len(out) > 1 else out[0]

        return tf.data.Dataset.from_generator(batches, output_signature=tuple(signature) if len(signature) > 1 else signature[0])

    def __repr__(self) -> str:
        return f"DataIterator({self._plan.name}: rank {self._rank} of {self._world}, {self.count()} rows an epoch, epoch {self.epoch})"


def _cut(buf: Any, n: int, rng: Any) -> Any:
    """``n`` rows of ``buf`` (the first, or drawn at random) and the rest."""
    if rng is None:
        return buf.slice(0, n), buf.slice(n)
    import numpy as np

    pick = rng.permutation(buf.num_rows)
    return buf.take(pick[:n]), buf.take(np.sort(pick[n:]))
