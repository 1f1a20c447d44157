"""``Checkpoint`` lives in ``nestor._checkpoint`` (both ``nestor.train`` and
``nestor.tune`` use it); this name stays for what was pickled before."""

from .._checkpoint import Checkpoint

__all__ = ["Checkpoint"]
