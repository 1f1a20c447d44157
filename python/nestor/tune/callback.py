"""Ray Tune's ``Callback`` (``ray.tune.callback``): see ``nestor._callback``,
where it lives so that ``nestor.train`` builds on it without importing
this package."""

from .._callback import Callback, Trial

__all__ = ["Callback", "Trial"]
