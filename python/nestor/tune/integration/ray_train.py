"""Ray Train V2's Tune pattern (``ray.tune.integration.ray_train``): a
function trainable that builds a ``TorchTrainer`` and calls ``fit()``, with
``TuneReportCallback`` in the trainer's ``RunConfig(callbacks=...)``.

Inside a trial, ``fit()`` has the driver run the trainer as the trial's
own run (its workers, its ``ScalingConfig``, its checkpoints under the
trial's directory, ``<trial>/train/<name>``), and this callback reports
each of its results to the trial: the scheduler decides on them, and when
it stops the trial the driver stops the trainer's run too. A trial restarted from the
start (a failure, a resume) finds its trainer's run and goes on from its
latest checkpoint, as ``fit()`` does for a run of the same name.
"""

from typing import Any, Dict, List, Optional

from ... import _contract
from ...train import UserCallback

#: The metric naming the trainer's checkpoint in the trial's results (Ray's key).
CHECKPOINT_PATH_KEY = "checkpoint_path"

#: What the trainer's run adds to each result, which the trial adds again for itself.
_AUTOMATIC = {"training_iteration", "time_this_iter_s", "time_total_s", "timestamp", "trial_id", "done", "checkpoint"}


class TuneReportCallback(UserCallback):
    """Reports each result of a trainer's run to the Tune trial that runs it."""

    def __init__(self) -> None:
        if not _contract.inside():
            raise RuntimeError("TuneReportCallback must be used in a Tune session: in the function a tune.Tuner runs")
        #: The trial was stopped (by its scheduler or a stopper): the trainer's run is being stopped.
        self.stopped = False

    def after_report(self, run_context: Any, metrics: List[Dict[str, Any]], checkpoint: Optional[Any]) -> None:
        from ... import report

        if self.stopped:
            return
        out = {k: v for k, v in metrics[0].items() if k not in _AUTOMATIC}
        if checkpoint is not None:
            out[CHECKPOINT_PATH_KEY] = checkpoint.path
        try:
            report(out)
        except SystemExit:
            # The trial is over: the driver stops its trainer's run, and fit()
            # then ends the trial's function cleanly.
            self.stopped = True


__all__ = ["CHECKPOINT_PATH_KEY", "TuneReportCallback"]
