"""Ray Data's aggregates (``ray.data.aggregate``) for ``Dataset.aggregate``
and ``groupby(...).aggregate``: computed with Arrow over the data set the
driver reads, named as Ray names them (``count()``, ``mean(x)``)."""

from typing import Any, Dict, List, Optional, Sequence

from ._blocks import _pa

__all__ = ["AbsMax", "AggregateFn", "Count", "Max", "Mean", "Min", "Quantile", "Std", "Sum", "Unique"]


class AggregateFn:
    """One aggregate: a name, and what it computes over a column of a group."""

    #: Arrow's hash aggregation for it (``table.group_by().aggregate``), or None.
    _arrow: Optional[str] = None

    def __init__(self, on: Optional[str] = None, ignore_nulls: bool = True, alias_name: Optional[str] = None):
        self.on = on
        self.ignore_nulls = ignore_nulls
        self.name = alias_name or f"{type(self).__name__.lower()}({on or ''})"

    def _options(self) -> Any:
        import pyarrow.compute as pc

        return pc.ScalarAggregateOptions(skip_nulls=self.ignore_nulls)

    def _value(self, column: Any) -> Any:
        """Its value over one group's column (a pyarrow ChunkedArray)."""
        import pyarrow.compute as pc

        return getattr(pc, self._arrow)(column, options=self._options()).as_py()  # type: ignore[arg-type]


class Count(AggregateFn):
    """Rows (of ``on``: its non-null values)."""

    _arrow = "count"

    def __init__(self, on: Optional[str] = None, ignore_nulls: bool = False, alias_name: Optional[str] = None):
        super().__init__(on, ignore_nulls, alias_name)

    def _options(self) -> Any:
        import pyarrow.compute as pc

        return pc.CountOptions(mode="only_valid" if self.on and self.ignore_nulls else "all")


class Sum(AggregateFn):
    _arrow = "sum"


class Min(AggregateFn):
    _arrow = "min"


class Max(AggregateFn):
    _arrow = "max"


class Mean(AggregateFn):
    _arrow = "mean"


class Std(AggregateFn):
    """The standard deviation, with ``ddof`` (1: the sample's, as in Ray)."""

    _arrow = "stddev"

    def __init__(self, on: Optional[str] = None, ddof: int = 1, ignore_nulls: bool = True, alias_name: Optional[str] = None):
        super().__init__(on, ignore_nulls, alias_name)
        self.ddof = ddof

    def _options(self) -> Any:
        import pyarrow.compute as pc

        return pc.VarianceOptions(ddof=self.ddof, skip_nulls=self.ignore_nulls)


class AbsMax(AggregateFn):
    """The largest absolute value."""

    def _value(self, column: Any) -> Any:
        import pyarrow.compute as pc

        return pc.max(pc.abs(column), skip_nulls=self.ignore_nulls).as_py()


class Quantile(AggregateFn):
    """The ``q`` quantile (linear interpolation)."""

    def __init__(self, on: Optional[str] = None, q: float = 0.5, ignore_nulls: bool = True, alias_name: Optional[str] = None):
        super().__init__(on, ignore_nulls, alias_name)
        self.q = q

    def _value(self, column: Any) -> Any:
        import pyarrow.compute as pc

        got = pc.quantile(column, q=self.q, skip_nulls=self.ignore_nulls).to_pylist()
        return got[0] if got else None


class Unique(AggregateFn):
    """The distinct values, as a list."""

    def _value(self, column: Any) -> Any:
        values = column.unique().to_pylist()
        return [v for v in values if v is not None] if self.ignore_nulls else values


def _aggregate(table: Any, keys: Sequence[str], aggs: Sequence[AggregateFn]) -> Any:
    """One row per group of ``keys`` (one row in all without keys): the keys, then each aggregate."""
    pa = _pa()
    for a in aggs:
        if not isinstance(a, AggregateFn):
            raise TypeError(f"aggregate: {a!r} is not an aggregate; give nestor.data.aggregate's Count(), Sum('x'), ...")
        if a.on is None and not isinstance(a, Count):
            raise ValueError(f"aggregate {type(a).__name__}(): name the column it aggregates (on=...)")
        if a.on is not None and a.on not in table.column_names:
            raise ValueError(f"aggregate {a.name}: no column {a.on!r} (the data set has {', '.join(table.column_names)})")
    if not keys:
        return pa.table({a.name: [table.num_rows if isinstance(a, Count) and not a.on else a._value(table.column(a.on))]
                         for a in aggs})
    table = table.sort_by([(k, "ascending") for k in keys])
    key_cols = [table.column(k).to_pylist() for k in keys]
    starts = [0] + [i for i in range(1, table.num_rows) if any(c[i] != c[i - 1] for c in key_cols)] + [table.num_rows]
    out: Dict[str, List[Any]] = {k: [] for k in keys}
    out.update({a.name: [] for a in aggs})
    for lo, hi in zip(starts, starts[1:]):
        if hi <= lo:
            continue
        group = table.slice(lo, hi - lo)
        for k, col in zip(keys, key_cols):
            out[k].append(col[lo])
        for a in aggs:
            if isinstance(a, Count) and not a.on:
                out[a.name].append(hi - lo)
            else:
                out[a.name].append(a._value(group.column(a.on)))
    return pa.table(out)
