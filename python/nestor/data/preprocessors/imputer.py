"""Ray's ``SimpleImputer`` (``ray.data.preprocessors.imputer``)."""

from typing import Any, List, Optional

from ..preprocessor import Preprocessor

__all__ = ["SimpleImputer"]


class SimpleImputer(Preprocessor):
    """Missing values filled with each column's mean (``strategy="mean"``),
    its most frequent value (``"most_frequent"``) or ``fill_value``
    (``"constant"``, which needs no ``fit``)."""

    _STRATEGIES = ("mean", "most_frequent", "constant")

    def __init__(self, columns: List[str], strategy: str = "mean", fill_value: Any = None,
                 *, output_columns: Optional[List[str]] = None):
        super().__init__()
        if strategy not in self._STRATEGIES:
            raise ValueError(f"SimpleImputer(strategy={strategy!r}): give one of {', '.join(self._STRATEGIES)}")
        if strategy == "constant" and fill_value is None:
            raise ValueError('SimpleImputer(strategy="constant") needs fill_value=')
        self.columns = list(columns)
        self.strategy = strategy
        self.fill_value = fill_value
        self.output_columns = Preprocessor._derive_and_validate_output_columns(self.columns, output_columns)
        self._is_fittable = strategy != "constant"

    def _fit_columns(self) -> List[str]:
        return self.columns

    def _fit_frame(self, frame: Any) -> None:
        for col in self.columns:
            if self.strategy == "mean":
                self.stats_[f"mean({col})"] = float(frame[col].mean())
            else:
                counts = frame[col].dropna().value_counts()
                # The most frequent; among ties the smallest, as Ray's.
                top = counts[counts == counts.max()].index if len(counts) else []
                self.stats_[f"most_frequent({col})"] = sorted(top)[0] if len(top) else None

    def _transform_pandas(self, frame: Any) -> Any:
        for col, out in zip(self.columns, self.output_columns):
            value = self.fill_value if self.strategy == "constant" else self.stats_[f"{self.strategy}({col})"]
            if col not in frame:
                frame[out] = value
            else:
                frame[out] = frame[col].fillna(value)
        return frame
