"""Gradual warmup to the linearly scaled learning rate (Goyal et al. 2017).

The rate starts at the unscaled `learning_rate` and rises linearly to the scaled one over the
warmup steps, then stays there. It is a function of the optimizer's step counter, which is
saved in checkpoints, so a resumed job continues the schedule where it stopped.
"""

from __future__ import annotations

from train.framework import keras, ops


def warmup_rate(step: float, *, start: float, target: float, warmup_steps: int) -> float:
    """The pure formula; the Keras schedule below computes the same in tensors."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return start + (target - start) * step / warmup_steps


@keras.utils.register_keras_serializable(package="train")  # Horovod re-creates optimizers
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, start: float, target: float, warmup_steps: int):
        self.start, self.target, self.warmup_steps = start, target, warmup_steps

    def __call__(self, step):
        if self.warmup_steps <= 0:
            return ops.cast(self.target, "float32")
        progress = ops.minimum(ops.cast(step, "float32") / self.warmup_steps, 1.0)
        return self.start + (self.target - self.start) * progress

    def get_config(self) -> dict:
        return {"start": self.start, "target": self.target, "warmup_steps": self.warmup_steps}
