"""Ray Data's ``Preprocessor`` (``ray.data.preprocessor``): fitted on the
driver over the whole data set (its statistics in ``stats_``), applied in
the ranks batch by batch (``transform`` adds a ``map_batches`` step), and
saved beside a checkpoint as Ray does (``serialize()`` into the trainer's
``metadata=`` or a checkpoint's, ``Preprocessor.deserialize`` to get it
back)."""

import base64
import pickle
from typing import Any, Dict, List, Optional, Union

__all__ = ["Preprocessor", "PreprocessorNotFittedException", "SerializablePreprocessorBase"]

_MAGIC = "nestor-preprocessor:1:"


class PreprocessorNotFittedException(RuntimeError):
    """``transform`` of a preprocessor that needs ``fit`` first."""


class Preprocessor:
    """A transform fitted once over a data set. A subclass sets
    ``_is_fittable``, computes its ``stats_`` in ``_fit_frame`` (a pandas
    DataFrame of the columns it names) and transforms a DataFrame batch in
    ``_transform_pandas``."""

    _is_fittable = True

    class FitStatus:
        NOT_FITTABLE = "NOT_FITTABLE"
        NOT_FITTED = "NOT_FITTED"
        FITTED = "FITTED"
        PARTIALLY_FITTED = "PARTIALLY_FITTED"

    def __init__(self) -> None:
        self.stats_: Dict[str, Any] = {}
        self._fitted = False

    # What the data set must hold for fit (None: every column).
    def _fit_columns(self) -> Optional[List[str]]:
        return None

    def _fit_frame(self, frame: Any) -> None:
        """Computes ``stats_`` from the whole data set (a pandas DataFrame)."""

    def _transform_pandas(self, frame: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not transform batches")

    def fit_status(self) -> str:
        if not self._is_fittable:
            return self.FitStatus.NOT_FITTABLE
        return self.FitStatus.FITTED if self._fitted else self.FitStatus.NOT_FITTED

    def fit(self, ds: Any) -> "Preprocessor":
        """Computes the statistics over ``ds`` (read here, on the driver); returns self."""
        if self._is_fittable:
            cols = self._fit_columns()
            table = (ds.select_columns(cols) if cols else ds)._table()
            self.stats_ = {}
            self._fit_frame(table.to_pandas())
        self._fitted = True
        return self

    def fit_transform(self, ds: Any, **_ignored: Any) -> Any:
        return self.fit(ds).transform(ds)

    def _check_fitted(self) -> None:
        if self._is_fittable and not self._fitted:
            raise PreprocessorNotFittedException(f"`{type(self).__name__}` must be fitted before it transforms: call fit(ds) first")

    def transform(self, ds: Any, **_ignored: Any) -> Any:
        """``ds`` with this transform as one more step, run in the ranks as each reads its share."""
        self._check_fitted()
        return ds.map_batches(_Apply(self), batch_format="pandas")

    def transform_batch(self, data: Any) -> Any:
        """One batch transformed now: a pandas DataFrame, a dict of NumPy arrays or a pyarrow Table, given back in its kind."""
        self._check_fitted()
        import pandas as pd

        if isinstance(data, pd.DataFrame):
            return _with_tensors(self._transform_pandas(data.copy()))
        if isinstance(data, dict):
            from ._blocks import _from_format, _to_format

            return _to_format(_Apply(self)(_from_format(data).to_pandas()), "numpy")
        if hasattr(data, "to_pandas") and hasattr(data, "schema"):
            return _Apply(self)(data.to_pandas())
        raise TypeError(f"transform_batch: give a pandas DataFrame, a dict of arrays or a pyarrow Table, not {type(data).__name__}")

    def preferred_batch_format(self) -> str:
        return "pandas"

    def serialize(self) -> str:
        """This preprocessor, fitted statistics included, as a string (for metadata)."""
        return _MAGIC + base64.b64encode(pickle.dumps(self)).decode()

    @staticmethod
    def deserialize(serialized: Union[str, bytes]) -> "Preprocessor":
        """A preprocessor ``serialize()`` gave."""
        text = serialized.decode() if isinstance(serialized, bytes) else serialized
        if not text.startswith(_MAGIC):
            raise ValueError("Preprocessor.deserialize: not a string that nestor's Preprocessor.serialize() wrote")
        got = pickle.loads(base64.b64decode(text[len(_MAGIC):]))
        if not isinstance(got, Preprocessor):
            raise ValueError("Preprocessor.deserialize: the string holds no preprocessor")
        return got

    @staticmethod
    def _derive_and_validate_output_columns(columns: List[str], output_columns: Optional[List[str]]) -> List[str]:
        if output_columns is not None and len(output_columns) != len(columns):
            raise ValueError(f"output_columns has {len(output_columns)} names for {len(columns)} columns ({columns})")
        return list(output_columns) if output_columns is not None else list(columns)

    def __repr__(self) -> str:
        shown = {k.lstrip("_"): v for k, v in self.__dict__.items() if k not in ("stats_", "_fitted")}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


_TENSORS = "nestor_tensors"


def _set_tensor(frame: Any, name: str, matrix: Any) -> None:
    """Sets column ``name`` of ``frame`` to the rows of the 2-D ``matrix``
    (a vector a row), kept aside as one array: a batch on its way to Arrow
    becomes one fixed-size-list column at once, not a million small arrays."""
    frame.attrs.setdefault(_TENSORS, {})[name] = matrix
    frame[name] = 0  # a placeholder, replaced by the matrix's rows


def _values(frame: Any, name: str) -> Any:
    """Column ``name``'s values: a matrix set aside by ``_set_tensor``, else the column as NumPy."""
    return frame.attrs.get(_TENSORS, {}).get(name, frame[name].to_numpy())


def _with_tensors(frame: Any) -> Any:
    """``frame`` with the rows of its matrices in their columns (a DataFrame for the caller)."""
    for name, matrix in frame.attrs.pop(_TENSORS, {}).items():
        frame[name] = list(matrix)
    return frame


class _Columns(Preprocessor):
    """A preprocessor of named columns, written in place or into ``output_columns``."""

    def __init__(self, columns: List[str], output_columns: Optional[List[str]] = None):
        super().__init__()
        if not columns:
            raise ValueError(f"{type(self).__name__}: give the columns it works on")
        self.columns = list(columns)
        self.output_columns = Preprocessor._derive_and_validate_output_columns(self.columns, output_columns)

    def _fit_columns(self) -> List[str]:
        return self.columns


class _Apply:
    """A fitted preprocessor as a ``map_batches`` function (picklable: it
    goes to the ranks); it gives the batch back as an Arrow table."""

    def __init__(self, preprocessor: Preprocessor):
        self.preprocessor = preprocessor

    def __call__(self, frame: Any) -> Any:
        import pyarrow as pa

        from ._blocks import _column

        out = self.preprocessor._transform_pandas(frame)
        tensors = out.attrs.pop(_TENSORS, {})
        table = pa.Table.from_pandas(out, preserve_index=False)
        for name, matrix in tensors.items():
            table = table.set_column(table.column_names.index(name), name, _column(matrix))
        return table


#: Ray's base of its newer preprocessors; nestor's all serialize the same way.
SerializablePreprocessorBase = Preprocessor
