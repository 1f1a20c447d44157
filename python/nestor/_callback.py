"""Ray Tune's ``Callback`` (``ray.tune.callback.Callback``, ``ray.tune.Callback``).

A subclass's hooks run in the script's own process, fed every event of
the sweep once it is durable (the binary writes them to the driver; see
``nestor._hooks``). They are called in order, one at a time, on a thread of
the driver: a hook that raises is logged and the sweep goes on; one that
blocks holds up only the callbacks (past its deadline, 30 s by default,
nestor stops feeding them and the sweep goes on without them).

``trials`` is the list of the trials this session has seen, as ``Trial``
objects (``trial_id``, ``config``, ``status``, ``last_result``,
``checkpoint``, ``path``); ``iteration`` counts the events so far.
"""

from typing import Any, Dict, List, Optional


class Trial:
    """What a callback learns of a trial (the attributes of Ray's ``Trial`` that scripts read)."""

    def __init__(self, trial_id: str, experiment_path: str):
        import os

        self.trial_id = trial_id
        self.config: Dict[str, Any] = {}
        self.status = "PENDING"
        self.last_result: Dict[str, Any] = {}
        self.checkpoint_uri: Optional[str] = None
        self.error: Optional[str] = None
        self.path = os.path.join(experiment_path, "trials", trial_id)
        self.local_path = self.path
        self.logdir = self.path
        self.storage = None
        self.num_failures = 0
        self.experiment_tag = trial_id

    @property
    def checkpoint(self) -> Optional[Any]:
        """The latest committed checkpoint, a ``Checkpoint`` (None before the first)."""
        from ._checkpoint import Checkpoint

        return Checkpoint(self.checkpoint_uri) if self.checkpoint_uri else None

    @property
    def evaluated_params(self) -> Dict[str, Any]:
        return dict(self.config)

    def __str__(self) -> str:
        return self.trial_id

    def __repr__(self) -> str:
        return f"Trial({self.trial_id}, {self.status})"


class Callback:
    """Ray Tune's callback interface: override the hooks you need."""

    def setup(self, stop: Any = None, num_samples: Optional[int] = None, total_num_samples: Optional[int] = None,
              **info: Any) -> None:
        """Once, before the first trial starts."""

    def on_step_begin(self, iteration: int, trials: List[Trial], **info: Any) -> None:
        """Twice a second while trials run (nestor's loop has no steps of Ray's kind)."""

    def on_step_end(self, iteration: int, trials: List[Trial], **info: Any) -> None:
        """Right after ``on_step_begin``."""

    def on_trial_start(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        """A trial's first run started."""

    def on_trial_restore(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        """A trial runs again from a checkpoint: resumed after a pause, restarted after a failure or an exploit."""

    def on_trial_save(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        """A checkpoint of the trial was committed."""

    def on_trial_result(self, iteration: int, trials: List[Trial], trial: Trial, result: Dict[str, Any], **info: Any) -> None:
        """A result, durable in the store."""

    def on_trial_complete(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        """The trial ended TERMINATED."""

    def on_trial_recover(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        """A run failed and the trial runs again."""

    def on_trial_error(self, iteration: int, trials: List[Trial], trial: Trial, **info: Any) -> None:
        """The trial ended in ERROR for good."""

    def on_checkpoint(self, iteration: int, trials: List[Trial], trial: Trial, checkpoint: Any, **info: Any) -> None:
        """A checkpoint of the trial was committed (``checkpoint`` is a ``Checkpoint``)."""

    def on_experiment_end(self, trials: List[Trial], **info: Any) -> None:
        """The sweep is over; nothing follows."""

    def get_state(self) -> Optional[Dict]:
        return None

    def set_state(self, state: Dict) -> None:
        pass


__all__ = ["Callback", "Trial"]
