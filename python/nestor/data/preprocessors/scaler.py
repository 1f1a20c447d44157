"""Ray's scalers (``ray.data.preprocessors.scaler``): each column rescaled
by statistics fitted over the whole data set, in place or into
``output_columns``."""

from typing import Any, List, Optional, Tuple

from ..preprocessor import Preprocessor, _Columns

__all__ = ["MaxAbsScaler", "MinMaxScaler", "RobustScaler", "StandardScaler"]


class _Scaler(_Columns):
    def _shift_scale(self, col: str) -> Tuple[float, float]:
        raise NotImplementedError

    def _transform_pandas(self, frame: Any) -> Any:
        for col, out in zip(self.columns, self.output_columns):
            shift, scale = self._shift_scale(col)
            frame[out] = (frame[col] - shift) / (scale if scale else 1.0)
        return frame


class StandardScaler(_Scaler):
    """``(x - mean) / std`` (the population's std; a constant column is only centred)."""

    def _fit_frame(self, frame: Any) -> None:
        for col in self.columns:
            self.stats_[f"mean({col})"] = float(frame[col].mean())
            self.stats_[f"std({col})"] = float(frame[col].std(ddof=0))

    def _shift_scale(self, col: str) -> Tuple[float, float]:
        return self.stats_[f"mean({col})"], self.stats_[f"std({col})"]


class MinMaxScaler(_Scaler):
    """``(x - min) / (max - min)``: each column into [0, 1]."""

    def _fit_frame(self, frame: Any) -> None:
        for col in self.columns:
            self.stats_[f"min({col})"] = float(frame[col].min())
            self.stats_[f"max({col})"] = float(frame[col].max())

    def _shift_scale(self, col: str) -> Tuple[float, float]:
        lo = self.stats_[f"min({col})"]
        return lo, self.stats_[f"max({col})"] - lo


class MaxAbsScaler(_Scaler):
    """``x / max(|x|)``: each column into [-1, 1]."""

    def _fit_frame(self, frame: Any) -> None:
        for col in self.columns:
            self.stats_[f"abs_max({col})"] = float(frame[col].abs().max())

    def _shift_scale(self, col: str) -> Tuple[float, float]:
        return 0.0, self.stats_[f"abs_max({col})"]


class RobustScaler(_Scaler):
    """``(x - median) / (q_high - q_low)``, the quantiles of ``quantile_range``."""

    def __init__(self, columns: List[str], quantile_range: Tuple[float, float] = (0.25, 0.75),
                 output_columns: Optional[List[str]] = None, **_ignored: Any):
        super().__init__(columns, output_columns)
        lo, hi = quantile_range
        if not 0 <= lo < hi <= 1:
            raise ValueError(f"RobustScaler(quantile_range={quantile_range!r}): give (low, high) with 0 <= low < high <= 1")
        self.quantile_range = (float(lo), float(hi))

    def _fit_frame(self, frame: Any) -> None:
        lo, hi = self.quantile_range
        for col in self.columns:
            self.stats_[f"low_quantile({col})"] = float(frame[col].quantile(lo))
            self.stats_[f"median({col})"] = float(frame[col].quantile(0.5))
            self.stats_[f"high_quantile({col})"] = float(frame[col].quantile(hi))

    def _shift_scale(self, col: str) -> Tuple[float, float]:
        return self.stats_[f"median({col})"], self.stats_[f"high_quantile({col})"] - self.stats_[f"low_quantile({col})"]
