"""Ray Tune's class API (``ray.tune.Trainable``): a trainable written as
``setup`` / ``step`` / ``save_checkpoint`` / ``load_checkpoint`` /
``cleanup``, run by nestor from the warm process like a function trainable.

Each run of a trial is a fresh process: ``setup(config)`` is called once,
then ``load_checkpoint`` when the run resumes (a pausing scheduler's
promotion, a PBT exploit with the donor's checkpoint and the explored
config, a restart after a failure or a crash), then ``step()`` once per
reported result until the trial is stopped or a result says ``done``;
``cleanup()`` runs at the end of every run. ``reset_config`` is never called:
nestor reuses no process between runs, so there is nothing to reset.
"""

import copy
import os
import pickle
import time
from typing import Any, Dict, Optional, Union

#: The file a ``save_checkpoint`` that returns a dict is pickled into, and
#: the one naming the path it returned when it returned a path.
DICT_FILE = ".nestor_trainable_state.pkl"
PATH_FILE = ".nestor_trainable_path"


class Trainable:
    """A trainable as a class (Ray's ``tune.Trainable``). Override ``setup``,
    ``step`` and, for pausing schedulers and PBT, ``save_checkpoint`` and
    ``load_checkpoint``."""

    def __init__(self, config: Optional[Dict[str, Any]] = None, logger_creator: Any = None, storage: Any = None,
                 **setup_kwargs: Any):
        from . import get_context

        self.config: Dict[str, Any] = dict(config or {})
        self._ctx = get_context()
        self._iteration = self._ctx.start_iteration
        self._iterations_since_restore = 0
        self._time_total = 0.0
        self._restored = False
        self.setup(copy.deepcopy(self.config), **setup_kwargs)

    # What a subclass overrides.

    def setup(self, config: Dict[str, Any]) -> None:
        """Called once per run with the trial's config (and the objects of ``tune.with_parameters``)."""

    def step(self) -> Dict[str, Any]:
        """One iteration: returns its result (a dict of metrics; ``done: True`` ends the trial)."""
        raise NotImplementedError(f"{type(self).__name__}.step: a Trainable must define step() returning a dict of metrics")

    def save_checkpoint(self, checkpoint_dir: str) -> Optional[Union[Dict[str, Any], str]]:
        """Writes the state into ``checkpoint_dir``, or returns it as a dict (nestor pickles it)."""
        return None

    def load_checkpoint(self, checkpoint: Union[Dict[str, Any], str]) -> None:
        """Restores what ``save_checkpoint`` saved: its dict, or the checkpoint's directory."""

    def reset_config(self, new_config: Dict[str, Any]) -> bool:
        """Ray's reuse of an actor for another config; nestor never reuses a run's process."""
        return False

    def cleanup(self) -> None:
        """Called at the end of every run (stopped, paused, done or failed)."""

    @classmethod
    def default_resource_request(cls, config: Dict[str, Any]) -> Any:
        return None

    # What Tune gives a trainable.

    @property
    def iteration(self) -> int:
        """Iterations done so far, counting those of the checkpoint this run resumed from."""
        return self._iteration

    @property
    def training_iteration(self) -> int:
        return self._iteration

    @property
    def iterations_since_restore(self) -> int:
        return self._iterations_since_restore

    @property
    def trial_id(self) -> str:
        return self._ctx.trial_id

    @property
    def trial_name(self) -> str:
        return self._ctx.trial_id

    @property
    def logdir(self) -> str:
        return self._ctx.trial_dir

    @property
    def trial_resources(self) -> Any:
        from ._resources import this_trials

        return this_trials()

    def get_config(self) -> Dict[str, Any]:
        return self.config

    def train(self) -> Dict[str, Any]:
        """Runs one ``step()`` and returns its result with the iteration counters."""
        start = time.time()
        result = self.step()
        if not isinstance(result, dict):
            raise TypeError(f"{type(self).__name__}.step() returned {type(result).__name__}, not a dict of metrics")
        self._iteration += 1
        self._iterations_since_restore += 1
        self._time_total += time.time() - start
        result = dict(result)
        result.setdefault("iterations_since_restore", self._iterations_since_restore)
        return result

    def save(self, checkpoint_dir: Optional[str] = None) -> str:
        """Saves a checkpoint into ``checkpoint_dir`` (a new temporary directory when None); returns it."""
        if checkpoint_dir is None:
            import tempfile

            checkpoint_dir = tempfile.mkdtemp(prefix=f"nestor-{self.trial_id}-")
        os.makedirs(checkpoint_dir, exist_ok=True)
        out = self.save_checkpoint(checkpoint_dir)
        if isinstance(out, dict):
            with open(os.path.join(checkpoint_dir, DICT_FILE), "wb") as f:
                pickle.dump(out, f)
        elif isinstance(out, (str, os.PathLike)):
            rel = os.path.relpath(os.path.abspath(os.fspath(out)), os.path.abspath(checkpoint_dir))
            if rel.startswith(".."):
                raise ValueError(f"{type(self).__name__}.save_checkpoint returned {out}, which is outside {checkpoint_dir}")
            with open(os.path.join(checkpoint_dir, PATH_FILE), "w") as f:
                f.write(rel)
        elif out is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint returned {type(out).__name__}: return None, a dict or a path")
        return checkpoint_dir

    def restore(self, checkpoint_dir: str) -> None:
        """Loads a checkpoint ``save`` wrote: ``load_checkpoint`` gets the dict, the path or the directory."""
        state: Union[Dict[str, Any], str] = checkpoint_dir
        dict_file, path_file = os.path.join(checkpoint_dir, DICT_FILE), os.path.join(checkpoint_dir, PATH_FILE)
        if os.path.isfile(dict_file):
            with open(dict_file, "rb") as f:
                state = pickle.load(f)
        elif os.path.isfile(path_file):
            with open(path_file) as f:
                state = os.path.join(checkpoint_dir, f.read().strip())
        self.load_checkpoint(state)
        self._restored = True
        self._iterations_since_restore = 0

    def stop(self) -> None:
        """Ends this run: ``cleanup()``."""
        self.cleanup()


def run(cls: type, kwargs: Dict[str, Any], stop: Dict[str, float], checkpoint_at_end: bool) -> None:
    """One run of a class trainable on this rank: setup, restore, then a
    report per ``step()`` (with a checkpoint every ``checkpoint_frequency``
    iterations, and at the end with ``checkpoint_at_end``) until the trial is
    stopped (``report`` raises ``SystemExit``) or is done. A result with
    ``should_checkpoint: True`` is saved with a checkpoint too (Ray's key)."""
    import shutil
    import signal
    import tempfile

    from . import get_checkpoint, get_context, report

    ctx = get_context()
    ending = []

    def on_term(signum: int, _frame: Any) -> None:
        # nestor stops a run the scheduler gave up on (or paused) with SIGTERM: as in Ray,
        # its stop() and cleanup() still run; a second signal during them is ignored.
        if not ending:
            ending.append(signum)
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    trainable = cls(ctx.config, **kwargs)
    try:
        resume = get_checkpoint()
        if resume:
            trainable.restore(resume)
        frequency = ctx.checkpoint_frequency
        while True:
            result = trainable.train()
            done = bool(result.get("done")) or _meets(stop, result, trainable.iteration)
            save = (
                (frequency > 0 and trainable.iteration % frequency == 0)
                or (checkpoint_at_end and done)
                or bool(result.pop("should_checkpoint", False))
            )
            if not save:
                report(result)
            else:
                tmp = tempfile.mkdtemp(prefix=f"nestor-{ctx.trial_id}-")
                try:
                    report(result, checkpoint=trainable.save(tmp))
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
            if done:
                return
    finally:
        ending.append(0)
        trainable.stop()


def _meets(stop: Dict[str, float], result: Dict[str, Any], iteration: int) -> bool:
    """Whether ``result`` meets one of the dict-form stop criteria (``>=``, as the binary decides)."""
    for key, threshold in stop.items():
        value = iteration if key == "training_iteration" else result.get(key)
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, (int, float)) and value >= threshold:
            return True
    return False
