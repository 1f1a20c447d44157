"""Ray Data's entry points for nestor (``ray.data``): a data set declared in
the script, passed as ``TorchTrainer(datasets={"train": ds})``, and read by
each worker as its share (``nestor.train.get_dataset_shard("train")``).

A ``Dataset`` is a lazy description: files (``read_parquet``, ``read_csv``,
``read_json``, ``read_text``, ``read_numpy``, ``read_binary_files``,
``read_images``) or in-memory data (``from_pandas``, ``from_numpy``,
``from_arrow``, ``from_items``, ``from_torch``, ``from_huggingface``,
``range``, written once as Parquet when the run starts), plus transforms.
Where each runs:

- in the ranks, batch by batch, as each reads its share: ``map_batches``,
  ``map``, ``add_column``, ``drop_columns``, ``select_columns``,
  ``rename_columns`` and the preprocessors' ``transform``;
- on the driver, over the whole data set, when it is asked for or when the
  run starts: ``filter``, ``flat_map`` and ``random_sample`` (they change
  the number of rows, and every rank must read as many as the others),
  ``sort``, ``union``, ``groupby``, ``unique``, aggregates, ``materialize``,
  ``to_pandas``, ``take``, and a preprocessor's ``fit``.

The driver checks the files and counts their rows once; every rank then
reads only its share of each epoch (see ``nestor.data._split``), through Arrow.

``random_shuffle()`` is cheaper than Ray's global shuffle: each epoch the
blocks (Parquet row groups, or whole CSV/JSON files) come in a new seeded
order and the rows of each block in a new seeded order.
"""

import glob
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _ops
from ._blocks import _apply, _Block, _filesystem, _is_url, _open, _pa, _Plan, _read_block, _select, _to_format
from ._iterator import _Share
from .context import DataContext, ExecutionOptions, ExecutionResources

__all__ = ["DataConfig", "DataContext", "DataIterator", "Dataset", "ExecutionOptions", "ExecutionResources", "MaterializedDataset",
           "Preprocessor", "Schema", "from_arrow", "from_huggingface", "from_items", "from_numpy", "from_pandas", "from_torch",
           "range", "range_tensor", "read_binary_files", "read_csv", "read_images", "read_json", "read_numpy", "read_parquet",
           "read_text"]

_range = range


class Dataset:
    """A lazy data set: where its rows come from and what is done to them."""

    def __init__(self, source: Dict[str, Any], transforms: Optional[List[Any]] = None, shuffle: bool = False,
                 seed: Optional[int] = None):
        self._source = source
        self._transforms = list(transforms or [])
        self._shuffle = shuffle
        self._seed = seed
        #: Row selections applied in order when planned (``limit``, ``train_test_split``).
        self._selects: List[Any] = []
        #: A transform changes the number of rows (``filter``, ``flat_map``,
        #: ``random_sample``): the driver runs them when the run starts, so
        #: that the ranks' shares stay equal.
        self._resizes = False

    def _with(self, **changes: Any) -> "Dataset":
        d = type(self).__new__(type(self))
        Dataset.__init__(d, self._source, self._transforms, self._shuffle, self._seed)
        d._selects = list(self._selects)
        d._resizes = self._resizes
        for k, v in changes.items():
            setattr(d, k, v)
        return d

    def _then(self, fn: Callable[..., Any], resizes: bool = False) -> "Dataset":
        """The data set with the row transform ``fn`` (over an Arrow table) after its others."""
        return self._with(_transforms=self._transforms + [(fn, "pyarrow", {})], _resizes=self._resizes or resizes)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"nestor.data.Dataset has no {name}() (ray.data.Dataset.{name}): nestor's data sets have the reads, "
                             "transforms and iterators a training script uses (docs/data.md); transform each batch with "
                             "map_batches")

    # ---- row transforms: in the ranks, batch by batch ----

    def map(self, fn: Callable[[Dict[str, Any]], Dict[str, Any]], *, fn_args: Any = None, fn_kwargs: Any = None,
            **_ignored: Any) -> "Dataset":
        """Each row (a dict) through ``fn``, which returns the new row."""
        import functools

        return self._then(functools.partial(_ops.map_rows, fn=_ops._row_fn("map", fn, fn_args, fn_kwargs)))

    def add_column(self, col: str, fn: Callable[[Any], Any], *, batch_format: str = "pandas", **_ignored: Any) -> "Dataset":
        """A column ``col`` (replaced if it exists): ``fn`` of each batch (a
        DataFrame, or as ``batch_format`` says) returns its values."""
        import functools

        if batch_format not in ("pandas", "numpy", "pyarrow"):
            raise ValueError(f"add_column(batch_format={batch_format!r}): give 'pandas', 'numpy' or 'pyarrow'")
        return self._then(functools.partial(_ops.add_column, col=col, fn=_ops._row_fn("add_column", fn, None, None),
                                            batch_format=batch_format))

    def drop_columns(self, cols: Union[str, List[str]], **_ignored: Any) -> "Dataset":
        """The data set without these columns."""
        import functools

        return self._then(functools.partial(_ops.drop_columns, cols=[cols] if isinstance(cols, str) else list(cols)))

    def select_columns(self, cols: Union[str, List[str]], **_ignored: Any) -> "Dataset":
        """These columns only, in this order."""
        import functools

        return self._then(functools.partial(_ops.select_columns, cols=[cols] if isinstance(cols, str) else list(cols)))

    def rename_columns(self, names: Union[Dict[str, str], List[str]], **_ignored: Any) -> "Dataset":
        """Columns renamed: ``{old: new}``, or every new name in order."""
        import functools

        if not isinstance(names, (dict, list)):
            raise TypeError(f"rename_columns: give a dict of old -> new names or a list of names, not {type(names).__name__}")
        return self._then(functools.partial(_ops.rename_columns, names=names))

    # ---- row transforms that change the number of rows: on the driver when the run starts ----

    def filter(self, fn: Optional[Callable[[Dict[str, Any]], bool]] = None, *, expr: Optional[str] = None, fn_args: Any = None,
               fn_kwargs: Any = None, **_ignored: Any) -> "Dataset":
        """The rows ``fn`` returns true for, or those the expression ``expr``
        (pandas' ``eval`` over the columns: ``"x > 3 and y == 'a'"``) holds for."""
        import functools

        if (fn is None) == (expr is None):
            raise ValueError("filter: give a function, or expr=, not both")
        call = _ops._row_fn("filter", fn, fn_args, fn_kwargs) if fn is not None else None
        return self._then(functools.partial(_ops.filter_rows, fn=call, expr=expr), resizes=True)

    def flat_map(self, fn: Callable[[Dict[str, Any]], List[Dict[str, Any]]], *, fn_args: Any = None, fn_kwargs: Any = None,
                 **_ignored: Any) -> "Dataset":
        """Each row into the list of rows ``fn`` returns for it (none, one or many)."""
        import functools

        return self._then(functools.partial(_ops.flat_map_rows, fn=_ops._row_fn("flat_map", fn, fn_args, fn_kwargs)), resizes=True)

    def random_sample(self, fraction: float, *, seed: Optional[int] = None) -> "Dataset":
        """About ``fraction`` of the rows, each kept at random (seeded: the same rows on every run with a seed)."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"random_sample(fraction={fraction}): give a fraction between 0 and 1")
        table = self._table()
        import numpy as np

        rng = np.random.default_rng(seed)
        return self._from_table(table.filter(_pa().array(rng.random(table.num_rows) < fraction)))

    # ---- whole-data operations: on the driver ----

    def _source_table(self) -> Any:
        """The rows of an in-memory source, as one Arrow table."""
        return _source_table(self._source)

    def _table(self) -> Any:
        """Every row, every transform done, as one Arrow table (read here, on the driver)."""
        pa = _pa()
        if self._source["kind"] != "files" and not self._selects:
            return _apply(self._source_table(), self._transforms)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="nestor-data-") as tmp:
            plan = self._plan_blocks("dataset", tmp)
            parts = [_apply(_read_block(b), plan.transforms) for b in plan.blocks]
        return pa.concat_tables(parts, promote_options="default") if parts else pa.table({})

    def _from_table(self, table: Any) -> "MaterializedDataset":
        return MaterializedDataset({"kind": "arrow", "data": table})

    def materialize(self) -> "MaterializedDataset":
        """Every row read and transformed now, held in memory (Ray's ``materialize``)."""
        return self._from_table(self._table())

    def sort(self, key: Union[str, List[str]], descending: Union[bool, List[bool]] = False) -> "MaterializedDataset":
        """The rows sorted by ``key`` (a column or several)."""
        return self._from_table(_ops.sort_table(self._table(), key, descending))

    def union(self, *others: "Dataset") -> "MaterializedDataset":
        """These rows, then each of ``others``' (the same columns)."""
        tables = [self._table()] + [o._table() for o in others]
        try:
            return self._from_table(_pa().concat_tables(tables, promote_options="default"))
        except _pa().ArrowInvalid as e:
            raise ValueError(f"union: the data sets' columns differ: {e}") from None

    def groupby(self, key: Union[str, List[str], None], **_ignored: Any) -> "_ops.GroupedData":
        """The rows grouped by ``key``: ``.count()``, ``.sum("x")``, ``.mean``, ``.aggregate(...)``, ``.map_groups(fn)``."""
        return _ops.GroupedData(self, key)

    def unique(self, column: str, **_ignored: Any) -> List[Any]:
        """The distinct values of ``column``."""
        return _ops.unique_values(self._table(), column)

    def aggregate(self, *aggs: Any) -> Dict[str, Any]:
        """The aggregates (``nestor.data.aggregate``'s ``Count()``, ``Mean("x")``, ...) over every row, by name."""
        from .aggregate import _aggregate

        return _aggregate(self._table(), [], aggs).to_pylist()[0]

    def _one(self, cls_name: str, on: Union[str, List[str]], **kwargs: Any) -> Any:
        from . import aggregate

        cls = getattr(aggregate, cls_name)
        cols = [on] if isinstance(on, str) else list(on)
        got = self.aggregate(*[cls(c, **kwargs) for c in cols])
        values = list(got.values())
        return values[0] if isinstance(on, str) else got

    def sum(self, on: Union[str, List[str]], ignore_nulls: bool = True) -> Any:
        return self._one("Sum", on, ignore_nulls=ignore_nulls)

    def min(self, on: Union[str, List[str]], ignore_nulls: bool = True) -> Any:
        return self._one("Min", on, ignore_nulls=ignore_nulls)

    def max(self, on: Union[str, List[str]], ignore_nulls: bool = True) -> Any:
        return self._one("Max", on, ignore_nulls=ignore_nulls)

    def mean(self, on: Union[str, List[str]], ignore_nulls: bool = True) -> Any:
        return self._one("Mean", on, ignore_nulls=ignore_nulls)

    def std(self, on: Union[str, List[str]], ddof: int = 1, ignore_nulls: bool = True) -> Any:
        return self._one("Std", on, ddof=ddof, ignore_nulls=ignore_nulls)

    def columns(self, fetch_if_missing: bool = True) -> List[str]:
        """The column names, after the transforms (read from the first rows)."""
        return list(self.limit(1)._table().column_names)

    def to_pandas(self, limit: Optional[int] = None) -> Any:
        """Every row as one pandas DataFrame (read here, on the driver)."""
        return (self.limit(limit) if limit is not None else self)._table().to_pandas()

    def to_arrow(self) -> Any:
        """Every row as one pyarrow Table."""
        return self._table()

    def to_numpy_refs(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError("ray.data.Dataset.to_numpy_refs is not in nestor: it has no object store; use to_pandas()")

    def take_all(self, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """Every row, as dicts."""
        return self._table().to_pylist()

    def take_batch(self, batch_size: int = 20, *, batch_format: str = "numpy") -> Any:
        """The first ``batch_size`` rows as one batch (a dict of NumPy arrays, a DataFrame or a pyarrow Table)."""
        return _to_format(self.limit(batch_size)._table(), "numpy" if batch_format == "default" else batch_format)

    def show(self, limit: int = 20) -> None:
        """Prints the first ``limit`` rows."""
        for row in self.take(limit):
            print(row)

    def iter_rows(self) -> Iterator[Dict[str, Any]]:
        """Every row (read on the driver)."""
        return iter(self._table().to_pylist())

    def iter_batches(self, **kwargs: Any) -> Iterator[Any]:
        """The rows in batches, read on the driver (``DataIterator.iter_batches``' options)."""
        return self._whole().iter_batches(**kwargs)

    def iter_torch_batches(self, **kwargs: Any) -> Iterator[Any]:
        """The rows as batches of torch tensors, read on the driver."""
        return self._whole().iter_torch_batches(**kwargs)

    def to_tf(self, *args: Any, **kwargs: Any) -> Any:
        """The rows as a ``tf.data.Dataset``, read on the driver."""
        return self._whole().to_tf(*args, **kwargs)

    def iterator(self) -> "DataIterator":
        """Every row, as one reader's ``DataIterator``."""
        return self._whole()

    def _whole(self) -> "DataIterator":
        return DataIterator(self.materialize()._plan("dataset", None), 0, 1)

    def streaming_split(self, n: int, *, equal: bool = False, locality_hints: Any = None) -> List["DataIterator"]:
        """``n`` iterators, each over its share of the rows (equal shares,
        ``equal`` or not), epoch after epoch: what a custom ``DataConfig``
        hands each rank."""
        if n < 1:
            raise ValueError(f"streaming_split({n}): give a number of splits >= 1")
        plan = (self.materialize() if self._resizes else self)._plan("dataset", None)
        return [DataIterator(plan, i, n) for i in _range(n)]

    def split(self, n: int, *, equal: bool = False, locality_hints: Any = None) -> List["MaterializedDataset"]:
        """``n`` data sets of about equal rows (exactly equal with ``equal``), in order."""
        table = self._table()
        per, extra = divmod(table.num_rows, n)
        out, at = [], 0
        for i in _range(n):
            size = per + (0 if equal or i >= extra else 1)
            out.append(self._from_table(table.slice(at, size)))
            at += size
        return out

    def num_blocks(self) -> int:
        return len(self._plan_blocks("dataset", None).blocks)

    def stats(self) -> str:
        return f"{self!r}: nestor reads each rank's share straight from the files (no execution statistics)"

    def limit(self, n: int) -> "Dataset":
        """The first ``n`` rows (in the files' order)."""
        if n < 0:
            raise ValueError(f"limit({n}): give a number of rows >= 0")
        return self._with(_selects=self._selects + [("limit", int(n))])

    def train_test_split(self, test_size: Union[int, float], *, shuffle: bool = False, seed: Optional[int] = None,
                         **_ignored: Any) -> Tuple["Dataset", "Dataset"]:
        """Two data sets: the rows but ``test_size`` (a fraction, or a
        number of rows), and those. As in Ray, the test rows are the last
        ones; with ``shuffle=True``, ``test_size`` rows drawn at random
        (seeded: the same split on every run with a seed). Either keeps its
        rows in the files' order. Counted when the run starts."""
        if isinstance(test_size, float) and not 0 < test_size < 1:
            raise ValueError(f"train_test_split(test_size={test_size}): a fraction is between 0 and 1")
        if isinstance(test_size, int) and test_size < 0:
            raise ValueError(f"train_test_split(test_size={test_size}): give a number of rows >= 0")
        split = ("split", test_size, bool(shuffle), seed)
        return self._with(_selects=self._selects + [split + (0,)]), self._with(_selects=self._selects + [split + (1,)])

    def repartition(self, num_blocks: Optional[int] = None, **_ignored: Any) -> "Dataset":
        """The same data set: nestor's blocks are the files' row groups (or
        whole files), split across the ranks row by row, whatever their number."""
        return self

    def map_batches(self, fn: Callable[..., Any], *, batch_format: str = "numpy", fn_kwargs: Optional[Dict[str, Any]] = None,
                    **_ignored: Any) -> "Dataset":
        """``fn`` run in the worker on each batch read (a dict of NumPy
        arrays, a pandas DataFrame or a pyarrow Table, as ``batch_format``
        says); it returns the batch's new form, in any of the three."""
        if not callable(fn):
            raise TypeError(f"map_batches: fn must be a function, not {type(fn).__name__}")
        if batch_format not in ("numpy", "pandas", "pyarrow", "default"):
            raise ValueError(f"map_batches(batch_format={batch_format!r}): give 'numpy', 'pandas' or 'pyarrow'")
        return self._with(_transforms=self._transforms + [(fn, "numpy" if batch_format == "default" else batch_format,
                                                           dict(fn_kwargs or {}))])

    def random_shuffle(self, *, seed: Optional[int] = None, **_ignored: Any) -> "Dataset":
        """A new order each epoch: blocks in a seeded order, rows within each
        block too (the same seed gives the same orders everywhere)."""
        return self._with(_shuffle=True, _seed=seed)

    def count(self) -> int:
        """The number of rows (from the files' metadata for Parquet)."""
        return self._plan("count", None).rows

    def schema(self) -> Any:
        """The Arrow schema of the rows read (before ``map_batches``)."""
        blocks = self._plan("schema", None).blocks
        if not blocks:
            return None
        return _read_block(blocks[0]).schema

    def take(self, n: int = 20) -> List[Dict[str, Any]]:
        """The first ``n`` rows, as dicts (read in the driver)."""
        plan = self._plan("take", None)
        out: List[Dict[str, Any]] = []
        for block in plan.blocks:
            out += _apply(_read_block(block), plan.transforms).slice(0, n - len(out)).to_pylist()
            if len(out) >= n:
                break
        return out

    def _plan(self, name: str, storage: Optional[str]) -> _Plan:
        """Checks the files and counts their rows (the driver, once); a data
        set whose transforms change the number of rows is computed here
        first, so that the ranks' shares stay equal."""
        if self._resizes:
            return self.materialize()._plan(name, storage)
        return self._plan_blocks(name, storage)

    def _plan_blocks(self, name: str, storage: Optional[str]) -> _Plan:
        src = self._source
        if src["kind"] == "files":
            paths = src["paths"]
        else:
            paths = [_materialise(src, name, storage)]
        blocks = _blocks(paths, src.get("format", "parquet"), name, src.get("options"))
        for select in self._selects:
            blocks = _selected(blocks, select, name)
        seed = self._seed if self._seed is not None else 0
        return _Plan(name=name, blocks=blocks, transforms=self._transforms, shuffle=self._shuffle, seed=seed)

    def __repr__(self) -> str:
        src = self._source
        what = ", ".join(src["paths"]) if src["kind"] == "files" else src["kind"]
        return f"Dataset({what}{', shuffled' if self._shuffle else ''}{f', {len(self._transforms)} map_batches' if self._transforms else ''})"


def _selected(blocks: List[_Block], select: Tuple[Any, ...], name: str) -> List[_Block]:
    """The blocks cut by one selection (``limit`` or one side of ``train_test_split``)."""
    total = sum(b.rows for b in blocks)
    if select[0] == "limit":
        return _select(blocks, _range(0, min(select[1], total)))
    _, size, shuffle, seed, side = select
    test = int(total * size) if isinstance(size, float) else int(size)
    if test > total:
        raise ValueError(f"datasets.{name}: train_test_split(test_size={size}) asks for more rows than the {total} there are")
    if not shuffle:
        return _select(blocks, _range(0, total - test) if side == 0 else _range(total - test, total))
    import numpy as np

    from ._split import permutation

    # A stream of its own (not an epoch's): the same split on every run with the seed.
    order = permutation(total, seed if seed is not None else 0, 0, (1 << 64) - 2)
    picked = order[:test] if side == 1 else order[test:]
    return _select(blocks, np.sort(picked))


def _files(paths: Union[str, Sequence[str]], fmt: str, **options: Any) -> Dict[str, Any]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    src: Dict[str, Any] = {"kind": "files", "paths": [p if _is_url(p) else os.path.abspath(p) for p in paths], "format": fmt}
    if options:
        src["options"] = options
    return src


def read_parquet(paths: Union[str, Sequence[str]], **_ignored: Any) -> Dataset:
    """Parquet files: a file, a directory (its ``*.parquet`` files) or a
    glob, or a list of them; local, or in an object store (``s3://``,
    ``gs://``; the credentials and endpoint from the environment, as for
    checkpoints)."""
    return Dataset(_files(paths, "parquet"))


def read_csv(paths: Union[str, Sequence[str]], **_ignored: Any) -> Dataset:
    """CSV files with a header row: a file, a directory or a glob, or a list."""
    return Dataset(_files(paths, "csv"))


def read_json(paths: Union[str, Sequence[str]], **_ignored: Any) -> Dataset:
    """Newline-delimited JSON files: a file, a directory or a glob, or a list."""
    return Dataset(_files(paths, "json"))


def read_text(paths: Union[str, Sequence[str]], *, encoding: str = "utf-8", drop_empty_lines: bool = True,
              include_paths: bool = False, **_ignored: Any) -> Dataset:
    """Text files, a row per line (column ``text``)."""
    return Dataset(_files(paths, "text", encoding=encoding, drop_empty_lines=drop_empty_lines, include_paths=include_paths))


def read_numpy(paths: Union[str, Sequence[str]], *, include_paths: bool = False, **_ignored: Any) -> Dataset:
    """``.npy`` files, a row per entry of each array's first axis (column ``data``)."""
    return Dataset(_files(paths, "numpy", include_paths=include_paths))


def read_binary_files(paths: Union[str, Sequence[str]], *, include_paths: bool = False, **_ignored: Any) -> Dataset:
    """Files of any kind, a row per file (column ``bytes``; ``path`` too with ``include_paths``)."""
    return Dataset(_files(paths, "binary", include_paths=include_paths))


def read_images(paths: Union[str, Sequence[str]], *, size: Optional[Tuple[int, int]] = None, mode: Optional[str] = None,
                include_paths: bool = False, **_ignored: Any) -> Dataset:
    """Images (PNG, JPEG, ...), a row per image (column ``image``, an array
    of height x width x channels), decoded with Pillow in the ranks;
    ``size=(height, width)`` resizes them, ``mode`` ("RGB", "L") converts them."""
    if size is not None and (len(size) != 2 or min(size) < 1):
        raise ValueError(f"read_images(size={size!r}): give (height, width)")
    return Dataset(_files(paths, "images", size=list(size) if size else None, mode=mode, include_paths=include_paths))


def from_arrow(tables: Any) -> "MaterializedDataset":
    """A pyarrow Table, or a list of them with the same columns."""
    pa = _pa()
    tables = tables if isinstance(tables, list) else [tables]
    return MaterializedDataset({"kind": "arrow", "data": pa.concat_tables(tables)})


def from_torch(dataset: Any) -> "MaterializedDataset":
    """A torch map-style ``Dataset``: a row per item (column ``item``), read now."""
    return MaterializedDataset({"kind": "items", "data": [{"item": _ops._plain(dataset[i])} for i in _range(len(dataset))]})


def range(n: int, **_ignored: Any) -> "MaterializedDataset":  # noqa: A001 (Ray's name)
    """The integers 0 .. n-1 (column ``id``)."""
    import numpy as np

    return MaterializedDataset({"kind": "numpy", "data": {"id": np.arange(n, dtype=np.int64)}})


def range_tensor(n: int, *, shape: Tuple[int, ...] = (1,), **_ignored: Any) -> "MaterializedDataset":
    """``n`` rows, row ``i`` an array of ``shape`` filled with ``i`` (column ``data``)."""
    import numpy as np

    return MaterializedDataset({"kind": "numpy", "data": {"data": np.arange(n, dtype=np.int64).reshape((n,) + (1,) * len(shape))
                                                          * np.ones((1,) + tuple(shape), dtype=np.int64)}})


def from_pandas(dfs: Any) -> Dataset:
    """One pandas DataFrame, or a list of them with the same columns."""
    frames = dfs if isinstance(dfs, list) else [dfs]
    return Dataset({"kind": "pandas", "data": frames})


def from_numpy(arrays: Any) -> Dataset:
    """A NumPy array (one column, ``data``), or a dict of column -> array."""
    return Dataset({"kind": "numpy", "data": arrays})


def from_items(items: List[Any]) -> Dataset:
    """A list of dicts (one per row), or of values (one column, ``item``)."""
    return Dataset({"kind": "items", "data": list(items)})


def from_huggingface(dataset: Any) -> Dataset:
    """A Hugging Face ``datasets.Dataset`` (one split; its rows as they
    are, after any ``select``/``shuffle``), written once as Parquet."""
    kind = type(dataset).__name__
    if kind == "DatasetDict" or isinstance(dataset, dict):
        raise ValueError(f"from_huggingface: give one split (dataset['train']), not a DatasetDict of {', '.join(dataset)}")
    if kind == "IterableDataset" or not hasattr(dataset, "with_format"):
        raise ValueError(f"from_huggingface takes a datasets.Dataset, not {kind} (a streamed one: "
                         "write it to Parquet and use read_parquet)")
    return Dataset({"kind": "arrow", "data": dataset.with_format("arrow")[:]})


#: Where data sets planned without a storage of their own are written
#: (a custom ``DataConfig.configure`` runs while a run is planned: its
#: splits go to the experiment's directory, which every rank reads).
_planning_storage: Optional[str] = None


class _planning_into:
    def __init__(self, storage: str):
        self.storage = storage

    def __enter__(self) -> None:
        global _planning_storage
        _planning_storage = self.storage

    def __exit__(self, *exc: Any) -> None:
        global _planning_storage
        _planning_storage = None


def _materialise(src: Dict[str, Any], name: str, storage: Optional[str]) -> str:
    """In-memory data as one Parquet file: written once into ``storage``
    (the experiment's directory), read from there by every rank."""
    import uuid

    import pyarrow.parquet as pq

    table = _source_table(src)
    if storage is None and _planning_storage is not None:
        storage, name = _planning_storage, f"{name}-{uuid.uuid4().hex[:12]}"
    if storage is None:
        import tempfile

        storage = tempfile.mkdtemp(prefix="nestor-data-")
    os.makedirs(storage, exist_ok=True)
    path = os.path.join(storage, f"{name}.parquet")
    tmp = path + ".tmp"
    pq.write_table(table, tmp, row_group_size=max(1024, min(65536, table.num_rows // 64 + 1)))
    os.replace(tmp, path)
    return path


def _source_table(src: Dict[str, Any]) -> Any:
    """An in-memory source's rows as one Arrow table."""
    pa = _pa()
    kind, data = src["kind"], src["data"]
    if kind == "arrow":
        table = data
    elif kind == "pandas":
        table = pa.concat_tables([pa.Table.from_pandas(df, preserve_index=False) for df in data])
    elif kind == "numpy":
        from ._blocks import _column

        table = pa.table({k: _column(v) for k, v in (dict(data) if isinstance(data, dict) else {"data": data}).items()})
    else:
        rows = data if all(isinstance(r, dict) for r in data) else [{"item": r} for r in data]
        table = pa.Table.from_pylist([{k: _ops._plain(v) for k, v in r.items()} for r in rows])
    return table


_SUFFIXES = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "json": (".json", ".jsonl"), "text": (".txt",), "numpy": (".npy",),
             "binary": ("",), "images": (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")}
#: Formats of a row per file: counted without reading them.
_ONE_ROW_A_FILE = ("binary", "images")


def _expand_url(url: str, fmt: str, name: str) -> List[str]:
    """The files an object-store URL names: one object, every object of the
    format below a prefix, or those a glob matches."""
    import fnmatch

    from pyarrow import fs

    scheme = url.split("://", 1)[0]
    filesystem, path = _filesystem(url)
    pattern = path if any(c in path for c in "*?[") else None
    base = path.split("*", 1)[0].rsplit("/", 1)[0] if pattern else path.rstrip("/")
    if pattern is None and not path.endswith("/"):
        try:
            if filesystem.get_file_info(path).type == fs.FileType.File:
                return [url]
        except OSError:
            pass  # not an object (some stores refuse to describe a prefix): list it
    try:
        found = filesystem.get_file_info(fs.FileSelector(base, recursive=pattern is not None, allow_not_found=True))
    except OSError as e:
        raise ValueError(f"datasets.{name}: cannot list {url}: {e}") from None
    files = sorted(f.path for f in found if f.type == fs.FileType.File)
    if pattern:
        files = [f for f in files if fnmatch.fnmatch(f, pattern)]
    else:
        files = [f for f in files if f.endswith(_SUFFIXES[fmt]) and not f.rsplit("/", 1)[-1].startswith(".")]
    if not files:
        raise ValueError(f"datasets.{name}: {url} does not exist, or holds no {fmt} file")
    return [f"{scheme}://{f}" for f in files]


def _expand(path: str, fmt: str, name: str) -> List[str]:
    if _is_url(path):
        return _expand_url(path, fmt, name)
    if any(c in path for c in "*?["):
        found = sorted(glob.glob(path))
        if not found:
            raise ValueError(f"datasets.{name}: no file matches {path}")
        return found
    if os.path.isdir(path):
        found = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(_SUFFIXES[fmt]) and not n.startswith("."))
        if not found:
            raise ValueError(f"datasets.{name}: directory {path} holds no {fmt} file")
        return found
    if not os.path.exists(path):
        raise ValueError(f"datasets.{name}: {path} does not exist")
    return [path]


def _blocks(paths: Sequence[str], fmt: str, name: str, options: Optional[Dict[str, Any]] = None) -> List[_Block]:
    pa = _pa()
    blocks: List[_Block] = []
    schema, first = None, None
    for path in [f for p in paths for f in _expand(p, fmt, name)]:
        if fmt in _ONE_ROW_A_FILE:
            blocks.append(_Block(path, fmt, 1, options=options))
            continue
        try:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                meta = pq.ParquetFile(_open(path))
                file_schema = meta.schema_arrow
                blocks += [_Block(path, fmt, meta.metadata.row_group(i).num_rows, i) for i in _range(meta.num_row_groups)]
            else:
                table = _read_block(_Block(path, fmt, 0, options=options))
                file_schema = table.schema
                blocks.append(_Block(path, fmt, table.num_rows, options=options))
        except (OSError, pa.ArrowException) as e:
            raise ValueError(f"datasets.{name}: cannot read {path} as {fmt}: {e}") from None
        if schema is None:
            schema, first = file_schema, path
        elif not file_schema.equals(schema):
            raise ValueError(f"datasets.{name}: {path} has columns {_columns(file_schema)}, unlike {first} ({_columns(schema)})")
    return blocks


def _columns(schema: Any) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


class DataIterator(_Share):
    """This rank's share of one data set, epoch after epoch (Ray's
    ``DataIterator``): ``iter_batches``, ``iter_torch_batches``,
    ``iter_rows``, ``to_tf``, ``to_torch``, and ``materialize``."""

    def materialize(self) -> "MaterializedDataset":
        """The next epoch's share of this rank, read now and held in memory,
        as a data set (Ray's ``DataIterator.materialize()``: its
        ``to_pandas()`` is the usual next step for XGBoost and LightGBM)."""
        pa = _pa()
        tables = list(self._tables(self._next_epoch(), 2))
        if tables:
            table = pa.concat_tables(tables, promote_options="default")
        elif self._plan.blocks:
            table = _read_block(self._plan.blocks[0]).slice(0, 0)  # no rows, the columns kept
        else:
            table = pa.table({})
        return MaterializedDataset({"kind": "arrow", "data": table})

    def to_pandas(self) -> Any:
        """The next epoch's share of this rank, as one pandas DataFrame."""
        return self.materialize().to_pandas()


class MaterializedDataset(Dataset):
    """A data set read and transformed already, held in memory (Ray's
    ``MaterializedDataset``): what ``materialize()``, ``sort``, ``union``
    and ``groupby`` give. A trainer writes it once as Parquet when its run
    starts, and each rank reads its share from there."""

    def count(self) -> int:
        return int(self._table().num_rows)

    def schema(self) -> Any:
        return self._table().schema


def __getattr__(name: str) -> Any:
    if name in ("preprocessors", "aggregate", "context", "preprocessor"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    # Ray's ``Schema``: nestor's data sets describe their rows with Arrow's.
    if name == "Schema":
        return _pa().Schema
    if name == "Preprocessor":
        from .preprocessor import Preprocessor

        return Preprocessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



class DataConfig:
    """Which data sets are split across the workers (``datasets_to_split``:
    ``"all"`` or a list of names); the others are read whole by every
    worker. A subclass may override ``configure`` (Ray's custom ingest): it
    is called on the driver when the run starts with the trainer's data
    sets and the number of workers, and returns, for each worker, a dict of
    name -> what that worker's ``get_dataset_shard(name)`` gives (a
    ``DataIterator`` from ``streaming_split``, or a ``Dataset`` read whole)."""

    def __init__(self, datasets_to_split: Union[str, List[str]] = "all", execution_options: Any = None,
                 enable_shard_locality: bool = True):
        if datasets_to_split != "all" and not isinstance(datasets_to_split, (list, tuple)):
            raise TypeError(f"DataConfig(datasets_to_split={datasets_to_split!r}): give 'all' or a list of names")
        self.datasets_to_split = datasets_to_split if datasets_to_split == "all" else list(datasets_to_split)
        self.execution_options = execution_options
        self.enable_shard_locality = enable_shard_locality

    def _splits(self, name: str) -> bool:
        return self.datasets_to_split == "all" or name in (self.datasets_to_split or [])

    @staticmethod
    def default_ingest_options() -> ExecutionOptions:
        """The execution options Ray uses for training data (accepted; nestor's ranks read their shares directly)."""
        return ExecutionOptions(locality_with_output=True, preserve_order=False)

    def configure(self, datasets: Dict[str, Dataset], world_size: int, worker_handles: Any = None,
                  worker_node_ids: Any = None, **kwargs: Any) -> List[Dict[str, Any]]:
        """Each worker's data sets: those split cut into ``world_size`` equal
        shares (``streaming_split(world_size, equal=True)``), the others whole."""
        out: List[Dict[str, Any]] = [{} for _ in _range(world_size)]
        for name, ds in datasets.items():
            parts = ds.streaming_split(world_size, equal=True) if self._splits(name) else [ds.iterator()] * world_size
            for rank in _range(world_size):
                out[rank][name] = parts[rank]
        return out

    def _custom(self) -> bool:
        return type(self).configure is not DataConfig.configure

