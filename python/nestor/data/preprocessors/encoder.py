"""Ray's encoders (``ray.data.preprocessors.encoder``): categories fitted
over the whole data set (sorted; ``max_categories`` keeps the most
frequent), then each value as its category's index or one-hot vector."""

from typing import Any, Dict, List, Optional

from ..preprocessor import Preprocessor, _Columns

__all__ = ["LabelEncoder", "OneHotEncoder", "OrdinalEncoder"]


def _categories(series: Any, limit: Optional[int]) -> Dict[Any, int]:
    """value -> index: the column's distinct values (the ``limit`` most frequent), sorted."""
    counts = series.dropna().value_counts()
    values = list(counts.index[:limit]) if limit else list(counts.index)
    try:
        values = sorted(values)
    except TypeError:
        values = sorted(values, key=repr)
    return {_key(v): i for i, v in enumerate(values)}


def _key(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


class _Encoder(_Columns):
    def _limit(self, col: str) -> Optional[int]:
        return None

    def _fit_frame(self, frame: Any) -> None:
        for col in self.columns:
            self.stats_[f"unique_values({col})"] = _categories(frame[col], self._limit(col))


class OrdinalEncoder(_Encoder):
    """Each value as its category's index (a value not seen in ``fit``: null)."""

    def __init__(self, columns: List[str], *, encode_lists: bool = True, output_columns: Optional[List[str]] = None):
        super().__init__(columns, output_columns)
        self.encode_lists = encode_lists

    def _transform_pandas(self, frame: Any) -> Any:
        for col, out in zip(self.columns, self.output_columns):
            index = self.stats_[f"unique_values({col})"]
            frame[out] = frame[col].map(lambda v: index.get(_key(v)))
        return frame


class OneHotEncoder(_Encoder):
    """Each value as a one-hot vector over its column's categories (all zeros
    for a value not seen in ``fit``, or one beyond ``max_categories``)."""

    def __init__(self, columns: List[str], *, max_categories: Optional[Dict[str, int]] = None,
                 output_columns: Optional[List[str]] = None):
        super().__init__(columns, output_columns)
        self.max_categories = dict(max_categories or {})

    def _limit(self, col: str) -> Optional[int]:
        return self.max_categories.get(col)

    def _transform_pandas(self, frame: Any) -> Any:
        import numpy as np

        from ..preprocessor import _set_tensor

        for col, out in zip(self.columns, self.output_columns):
            index = self.stats_[f"unique_values({col})"]
            at = frame[col].map(index).to_numpy(dtype=float, na_value=np.nan)
            hot = np.zeros((len(frame), len(index)), dtype=np.int64)
            known = ~np.isnan(at)
            hot[np.flatnonzero(known), at[known].astype(np.int64)] = 1
            _set_tensor(frame, out, hot)
        return frame


class LabelEncoder(Preprocessor):
    """The label column's values as their index among its sorted values
    (``inverse_transform`` gives the values back)."""

    def __init__(self, label_column: str, *, output_column: Optional[str] = None):
        super().__init__()
        self.label_column = label_column
        self.output_column = output_column or label_column

    def _fit_columns(self) -> List[str]:
        return [self.label_column]

    def _fit_frame(self, frame: Any) -> None:
        self.stats_[f"unique_values({self.label_column})"] = _categories(frame[self.label_column], None)

    def _transform_pandas(self, frame: Any) -> Any:
        index = self.stats_[f"unique_values({self.label_column})"]
        frame[self.output_column] = frame[self.label_column].map(lambda v: index.get(_key(v)))
        return frame

    def inverse_transform(self, ds: Any) -> Any:
        """The indices back into the values, in the ranks (``map_batches``)."""
        self._check_fitted()
        return ds.map_batches(_Inverse(self), batch_format="pandas")

    def inverse_transform_batch(self, frame: Any) -> Any:
        return _Inverse(self)(frame.copy())


class _Inverse:
    def __init__(self, encoder: LabelEncoder):
        self.values = {i: v for v, i in encoder.stats_[f"unique_values({encoder.label_column})"].items()}
        self.column = encoder.output_column
        self.label = encoder.label_column

    def __call__(self, frame: Any) -> Any:
        frame[self.label] = frame[self.column].map(self.values.get)
        return frame
