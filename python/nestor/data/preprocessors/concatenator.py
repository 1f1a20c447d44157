"""Ray's ``Concatenator`` (``ray.data.preprocessors.concatenator``)."""

from typing import Any, List, Optional

from ..preprocessor import Preprocessor

__all__ = ["Concatenator"]


class Concatenator(Preprocessor):
    """The ``columns`` joined into one column of arrays (``output_column_name``),
    the columns themselves dropped; ``dtype`` casts the arrays; ``flatten``
    flattens columns that hold arrays. Needs no ``fit``."""

    _is_fittable = False

    def __init__(self, columns: List[str], output_column_name: str = "concat_out", dtype: Any = None,
                 raise_if_missing: bool = False, flatten: bool = False):
        super().__init__()
        if not columns:
            raise ValueError("Concatenator: give the columns to join")
        self.columns = list(columns)
        self.output_column_name = output_column_name
        self.dtype = dtype
        self.raise_if_missing = raise_if_missing
        self.flatten = flatten

    def _transform_pandas(self, frame: Any) -> Any:
        import numpy as np

        missing = [c for c in self.columns if c not in frame]
        if missing and self.raise_if_missing:
            raise ValueError(f"Concatenator: the batch has no column {missing[0]!r} (it has {', '.join(frame.columns)})")
        from ..preprocessor import _values

        present = [c for c in self.columns if c in frame]
        parts = []
        for c in present:
            values = _values(frame, c)
            if values.dtype == object and len(values) and hasattr(values[0], "__len__"):
                values = np.stack([np.asarray(v).reshape(-1) if self.flatten else np.asarray(v) for v in values])
            parts.append(values.reshape(len(frame), -1))
        joined = np.concatenate(parts, axis=1) if parts else np.zeros((len(frame), 0))
        if self.dtype is not None:
            joined = joined.astype(self.dtype)
        from ..preprocessor import _set_tensor

        tensors = frame.attrs.get("nestor_tensors", {})
        for c in present:
            tensors.pop(c, None)
        frame = frame.drop(columns=present)
        _set_tensor(frame, self.output_column_name, joined)
        return frame
