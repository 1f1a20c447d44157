"""Ray's ``Chain`` (``ray.data.preprocessors.chain``)."""

from typing import Any

from ..preprocessor import Preprocessor

__all__ = ["Chain"]


class Chain(Preprocessor):
    """Preprocessors one after the other: each is fitted on the data set as
    the ones before it transform it, and they transform in that order."""

    def __init__(self, *preprocessors: Preprocessor):
        super().__init__()
        for p in preprocessors:
            if not isinstance(p, Preprocessor):
                raise TypeError(f"Chain: {p!r} is not a preprocessor")
        self.preprocessors = list(preprocessors)
        self._is_fittable = any(p._is_fittable for p in self.preprocessors)

    def fit(self, ds: Any) -> "Chain":
        for p in self.preprocessors:
            ds = p.fit(ds).transform(ds)
        self._fitted = True
        return self

    def fit_transform(self, ds: Any, **_ignored: Any) -> Any:
        for p in self.preprocessors:
            ds = p.fit_transform(ds)
        self._fitted = True
        return ds

    def transform(self, ds: Any, **_ignored: Any) -> Any:
        self._check_fitted()
        for p in self.preprocessors:
            ds = p.transform(ds)
        return ds

    def _check_fitted(self) -> None:
        for p in self.preprocessors:
            p._check_fitted()

    def _transform_pandas(self, frame: Any) -> Any:
        for p in self.preprocessors:
            frame = p._transform_pandas(frame)
        return frame

    def fit_status(self) -> str:
        statuses = {p.fit_status() for p in self.preprocessors} - {Preprocessor.FitStatus.NOT_FITTABLE}
        if not statuses:
            return Preprocessor.FitStatus.NOT_FITTABLE
        if statuses == {Preprocessor.FitStatus.FITTED}:
            return Preprocessor.FitStatus.FITTED
        return Preprocessor.FitStatus.NOT_FITTED if statuses == {Preprocessor.FitStatus.NOT_FITTED} else \
            Preprocessor.FitStatus.PARTIALLY_FITTED
