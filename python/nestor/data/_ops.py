"""Ray Data's transforms on nestor's data sets: the row ones as functions
over one block's Arrow table (run in the ranks, batch by batch, or on the
driver when a data set is read there), and the whole-data ones (sort,
group, unique) over a table the driver holds."""

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ._blocks import _pa


def _plain(value: Any) -> Any:
    """A row's value as Arrow takes it (arrays of any shape as nested lists)."""
    if hasattr(value, "ndim") and hasattr(value, "tolist") and getattr(value, "ndim", 0) >= 1:
        return value.tolist()
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


def _rows_table(rows: List[Dict[str, Any]], like: Any) -> Any:
    pa = _pa()
    if not rows:
        return like.schema.empty_table() if like is not None else pa.table({})
    return pa.Table.from_pylist([{k: _plain(v) for k, v in r.items()} for r in rows])


def _rows(table: Any) -> List[Dict[str, Any]]:
    """The table's rows as dicts; a column of arrays gives NumPy arrays, as Ray's rows do."""
    import numpy as np

    out = table.to_pylist()
    arrays = [n for n in table.column_names if _is_list(table.schema.field(n).type)]
    for r in out:
        for n in arrays:
            if r[n] is not None:
                r[n] = np.asarray(r[n])
    return out


def _is_list(t: Any) -> bool:
    pa = _pa()
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _row_fn(name: str, fn: Any, args: Any, kwargs: Any) -> Callable[[Dict[str, Any]], Any]:
    if not callable(fn):
        raise TypeError(f"{name}: fn must be a function (or a callable class), not {type(fn).__name__}")
    if isinstance(fn, type):
        raise ValueError(f"{name}: a callable class (Ray's actor pool) is not supported by nestor: give a function, "
                         "or build what the class holds inside it")
    return functools.partial(fn, *(args or ()), **(kwargs or {})) if args or kwargs else fn


def map_rows(table: Any, fn: Callable[[Dict[str, Any]], Dict[str, Any]]) -> Any:
    """``Dataset.map``: each row through ``fn``."""
    out = []
    for row in _rows(table):
        got = fn(row)
        if not isinstance(got, dict):
            raise TypeError(f"map: the function returned {type(got).__name__} for a row; return a dict (the new row)")
        out.append(got)
    return _rows_table(out, None if out else table)


def flat_map_rows(table: Any, fn: Callable[[Dict[str, Any]], List[Dict[str, Any]]]) -> Any:
    """``Dataset.flat_map``: each row into any number of rows."""
    out: List[Dict[str, Any]] = []
    for row in _rows(table):
        got = fn(row)
        for r in got:
            if not isinstance(r, dict):
                raise TypeError(f"flat_map: the function returned a {type(r).__name__} among its rows; return a list of dicts")
            out.append(r)
    return _rows_table(out, table)


def filter_rows(table: Any, fn: Optional[Callable[[Dict[str, Any]], bool]], expr: Optional[str]) -> Any:
    """``Dataset.filter``: the rows ``fn`` keeps, or those the expression ``expr`` (over the columns) is true for."""
    import numpy as np

    if expr is not None:
        frame = table.to_pandas()
        mask = np.asarray(frame.eval(expr), dtype=bool)
    else:
        mask = np.array([bool(fn(r)) for r in _rows(table)], dtype=bool)
    return table.filter(_pa().array(mask)) if len(mask) else table


def add_column(table: Any, col: str, fn: Callable[[Any], Any], batch_format: str) -> Any:
    """``Dataset.add_column``: ``fn`` of the batch (a DataFrame, or NumPy or Arrow as asked) is the new column."""
    from ._blocks import _to_format

    pa = _pa()
    values = fn(_to_format(table, batch_format))
    if hasattr(values, "to_numpy") and not isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = values.to_numpy()
    if not isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = pa.array(list(values) if getattr(values, "ndim", 1) > 1 else values)
    if len(values) != table.num_rows:
        raise ValueError(f"add_column({col!r}): the function returned {len(values)} values for a batch of {table.num_rows} rows")
    if col in table.column_names:
        return table.set_column(table.column_names.index(col), col, values)
    return table.append_column(col, values)


def _missing(table: Any, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in table.column_names]
    if missing:
        raise ValueError(f"{what}: no column {missing[0]!r} (the data set has {', '.join(table.column_names)})")


def drop_columns(table: Any, cols: List[str]) -> Any:
    """``Dataset.drop_columns``."""
    _missing(table, cols, "drop_columns")
    return table.drop_columns(cols)


def select_columns(table: Any, cols: List[str]) -> Any:
    """``Dataset.select_columns``: these columns, in this order."""
    _missing(table, cols, "select_columns")
    return table.select(cols)


def rename_columns(table: Any, names: Union[Dict[str, str], List[str]]) -> Any:
    """``Dataset.rename_columns``: old -> new names, or all the new names in order."""
    if isinstance(names, dict):
        _missing(table, list(names), "rename_columns")
        return table.rename_columns([names.get(c, c) for c in table.column_names])
    if len(names) != table.num_columns:
        raise ValueError(f"rename_columns: {len(names)} names for {table.num_columns} columns ({', '.join(table.column_names)})")
    return table.rename_columns(list(names))


def sample_rows(table: Any, fraction: float, seed: Optional[int], block: int) -> Any:
    """``Dataset.random_sample``: each row kept with probability ``fraction`` (seeded per block)."""
    import numpy as np

    rng = np.random.default_rng(None if seed is None else [seed, block])
    return table.filter(_pa().array(rng.random(table.num_rows) < fraction))


# ---- whole-data operations, over a table the driver holds ----


def sort_table(table: Any, key: Union[str, List[str]], descending: Union[bool, List[bool]]) -> Any:
    keys = [key] if isinstance(key, str) else list(key)
    _missing(table, keys, "sort")
    orders = descending if isinstance(descending, list) else [descending] * len(keys)
    if len(orders) != len(keys):
        raise ValueError(f"sort: {len(orders)} orders (descending=) for {len(keys)} keys")
    return table.sort_by([(k, "descending" if d else "ascending") for k, d in zip(keys, orders)])


def unique_values(table: Any, column: str) -> List[Any]:
    _missing(table, [column], "unique")
    return table.column(column).unique().to_pylist()


class GroupedData:
    """``Dataset.groupby(key)``: the rows grouped by one column (or several),
    counted and aggregated with Arrow, or each group passed to a function
    (``map_groups``). It runs on the driver, over the whole data set, when
    asked: what it gives is a new data set, for training like any other."""

    def __init__(self, dataset: Any, key: Union[str, List[str], None]):
        self._dataset = dataset
        self._keys = [] if key is None else [key] if isinstance(key, str) else list(key)

    def _table(self) -> Any:
        table = self._dataset._table()
        _missing(table, self._keys, "groupby")
        return table

    def aggregate(self, *aggs: Any) -> Any:
        """One row per group: the keys and each aggregate's value (``ray.data.aggregate``'s ``Count``, ``Sum``, ...)."""
        from .aggregate import _aggregate

        return self._dataset._from_table(_aggregate(self._table(), self._keys, aggs))

    def count(self) -> Any:
        from .aggregate import Count

        return self.aggregate(Count())

    def _simple(self, cls_name: str, on: Union[str, List[str], None], **kwargs: Any) -> Any:
        from . import aggregate

        cls = getattr(aggregate, cls_name)
        cols = [on] if isinstance(on, str) else list(on or [])
        if not cols:
            table = self._table()
            cols = [c for c in table.column_names if c not in self._keys]
        return self.aggregate(*[cls(c, **kwargs) for c in cols])

    def sum(self, on: Union[str, List[str], None] = None, ignore_nulls: bool = True) -> Any:
        return self._simple("Sum", on, ignore_nulls=ignore_nulls)

    def min(self, on: Union[str, List[str], None] = None, ignore_nulls: bool = True) -> Any:
        return self._simple("Min", on, ignore_nulls=ignore_nulls)

    def max(self, on: Union[str, List[str], None] = None, ignore_nulls: bool = True) -> Any:
        return self._simple("Max", on, ignore_nulls=ignore_nulls)

    def mean(self, on: Union[str, List[str], None] = None, ignore_nulls: bool = True) -> Any:
        return self._simple("Mean", on, ignore_nulls=ignore_nulls)

    def std(self, on: Union[str, List[str], None] = None, ddof: int = 1, ignore_nulls: bool = True) -> Any:
        return self._simple("Std", on, ddof=ddof, ignore_nulls=ignore_nulls)

    def map_groups(self, fn: Callable[..., Any], *, batch_format: str = "default", fn_args: Any = None,
                   fn_kwargs: Any = None, **_ignored: Any) -> Any:
        """``fn`` of each group's rows (a dict of NumPy arrays, a DataFrame or
        an Arrow table, as ``batch_format`` says), its results together as a new data set."""
        from ._blocks import _from_format, _to_format

        call = _row_fn("map_groups", fn, fn_args, fn_kwargs)
        fmt = "numpy" if batch_format == "default" else batch_format
        table = self._table()
        if not self._keys:
            return self._dataset._from_table(_from_format(call(_to_format(table, fmt))))
        pa = _pa()
        table = table.sort_by([(k, "ascending") for k in self._keys])
        keys = [table.column(k).to_pylist() for k in self._keys]
        starts = [0] + [i for i in range(1, table.num_rows) if any(col[i] != col[i - 1] for col in keys)] + [table.num_rows]
        parts = [_from_format(call(_to_format(table.slice(lo, hi - lo), fmt))) for lo, hi in zip(starts, starts[1:]) if hi > lo]
        return self._dataset._from_table(pa.concat_tables(parts, promote_options="default") if parts else table.slice(0, 0))
