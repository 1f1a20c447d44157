"""Ray's ``Normalizer`` (``ray.data.preprocessors.normalizer``)."""

from typing import Any, List, Optional

from ..preprocessor import Preprocessor

__all__ = ["Normalizer"]


class Normalizer(Preprocessor):
    """Each row's values of ``columns`` divided by their norm (``"l1"``,
    ``"l2"`` or ``"max"``), so that the row has norm 1. Needs no ``fit``."""

    _is_fittable = False
    _NORMS = ("l1", "l2", "max")

    def __init__(self, columns: List[str], norm: str = "l2", *, output_columns: Optional[List[str]] = None):
        super().__init__()
        if norm not in self._NORMS:
            raise ValueError(f"Normalizer(norm={norm!r}): give one of {', '.join(self._NORMS)}")
        self.columns = list(columns)
        self.norm = norm
        self.output_columns = Preprocessor._derive_and_validate_output_columns(self.columns, output_columns)

    def _transform_pandas(self, frame: Any) -> Any:
        import numpy as np

        values = frame[self.columns].to_numpy(dtype=float)
        if self.norm == "l1":
            norms = np.abs(values).sum(axis=1)
        elif self.norm == "l2":
            norms = np.sqrt((values ** 2).sum(axis=1))
        else:
            norms = np.abs(values).max(axis=1)
        norms[norms == 0] = 1.0
        scaled = values / norms[:, None]
        for i, out in enumerate(self.output_columns):
            frame[out] = scaled[:, i]
        return frame
