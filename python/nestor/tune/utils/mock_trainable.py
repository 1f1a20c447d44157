"""``ray.tune.utils.mock_trainable``: the toy class trainable Tune's
examples use. Its reward follows a saturating curve whose steepness and
ceiling come from the config (``width``, ``height``), so schedulers have
something to compare without any training."""

import json
import math
import os
from typing import Any, Dict

from ..._trainable import Trainable

__all__ = ["MyTrainableClass"]


class MyTrainableClass(Trainable):
    """``episode_reward_mean`` = ``height * tanh(step / width)``; checkpoints
    hold the step it is at (a JSON file), so pausing schedulers and PBT
    carry it across runs."""

    def setup(self, config: Dict[str, Any]) -> None:
        self.timestep = 0

    def step(self) -> Dict[str, Any]:
        self.timestep += 1
        width = float(self.config.get("width", 1)) or 1.0
        reward = math.tanh(self.timestep / width) * float(self.config.get("height", 1))
        return {"episode_reward_mean": reward, "timesteps_total": self.timestep}

    def save_checkpoint(self, checkpoint_dir: str) -> str:
        path = os.path.join(checkpoint_dir, "checkpoint.json")
        with open(path, "w") as f:
            json.dump({"timestep": self.timestep}, f)
        return checkpoint_dir

    def load_checkpoint(self, checkpoint: Any) -> None:
        with open(os.path.join(checkpoint, "checkpoint.json")) as f:
            self.timestep = int(json.load(f)["timestep"])
