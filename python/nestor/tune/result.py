"""Ray's names of result keys (``ray.tune.result``)."""

TRAINING_ITERATION = "training_iteration"
TIME_THIS_ITER_S = "time_this_iter_s"
TIME_TOTAL_S = "time_total_s"
TIMESTAMP = "timestamp"
TRIAL_ID = "trial_id"
DONE = "done"
#: A class trainable's ``step()`` result with this key true is saved as a checkpoint.
SHOULD_CHECKPOINT = "should_checkpoint"
MEAN_ACCURACY = "mean_accuracy"
MEAN_LOSS = "mean_loss"
EPISODE_REWARD_MEAN = "episode_reward_mean"
CONFIG_PREFIX = "config"

__all__ = [
    "CONFIG_PREFIX", "DONE", "EPISODE_REWARD_MEAN", "MEAN_ACCURACY", "MEAN_LOSS", "SHOULD_CHECKPOINT", "TIMESTAMP",
    "TIME_THIS_ITER_S", "TIME_TOTAL_S", "TRAINING_ITERATION", "TRIAL_ID",
]
