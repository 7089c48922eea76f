"""The large-batch plan: per-device batch, gradient accumulation and learning rate.

The user fixes the global batch (samples per optimizer step over the whole cluster). Each of
the W devices then owns global/W samples per step; when that exceeds what one device holds
(`max_device_batch_size`), the step is split into k micro-batches whose gradients are
accumulated before the allreduce (Horovod's backward_passes_per_step), i.e. one device
imitates a k times bigger one. So the same job gives the same optimisation on 1 GPU or 64.

The learning rate follows the linear scaling rule (Goyal et al., "Accurate, Large Minibatch
SGD", 2017): `learning_rate` is tuned for `base_batch_size`, and is multiplied by
global_batch / base_batch_size, reached by a linear warmup. Pure arithmetic, no TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from job.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    world_size: int
    global_batch: int
    per_device_batch: int
    micro_batch: int
    accumulation_steps: int
    base_learning_rate: float
    learning_rate: float
    # Devices each model is split over (job.mesh): `world_size` then counts data-parallel
    # replicas, each of model_parallel devices, not devices.
    model_parallel: int = 1

    def derivation(self) -> str:
        """One line a person can check by hand."""
        replicas = (
            f"{self.world_size} device(s)"
            if self.model_parallel == 1
            else f"{self.world_size} data-parallel replica(s) of {self.model_parallel} devices"
        )
        return (
            f"global batch {self.global_batch} = {replicas} x "
            f"{self.accumulation_steps} accumulated micro-batch(es) x {self.micro_batch}; "
            f"learning rate {self.base_learning_rate:g} x {self.global_batch}/"
            f"base batch = {self.learning_rate:g}"
        )


def plan_batches(
    *,
    world_size: int,
    global_batch_size: int,
    per_device_batch_size: int,
    max_device_batch_size: int,
    learning_rate: float,
    base_batch_size: int,
    scale_learning_rate: bool,
    model_parallel: int = 1,
) -> BatchPlan:
    """Derive the per-device work of one optimizer step; ConfigError when impossible.
    With `model_parallel` > 1, `world_size` is the data-parallel replicas (job.mesh's readers):
    a "device" below is one replica, whose batch its model_parallel devices share."""
    if world_size < 1:
        raise ConfigError(f"world size must be at least 1, got {world_size}")
    global_batch = global_batch_size or per_device_batch_size * world_size
    if global_batch % world_size:
        lower = global_batch - global_batch % world_size
        raise ConfigError(
            f"global_batch_size={global_batch} cannot be split evenly over {world_size} "
            f"devices; use a multiple of {world_size}, e.g. {lower or world_size} or "
            f"{lower + world_size}"
        )
    per_device = global_batch // world_size
    accumulation = math.ceil(per_device / max_device_batch_size)
    while per_device % accumulation:
        accumulation += 1
    scale = global_batch / base_batch_size if scale_learning_rate else 1.0
    return BatchPlan(
        world_size=world_size,
        global_batch=global_batch,
        per_device_batch=per_device,
        micro_batch=per_device // accumulation,
        accumulation_steps=accumulation,
        base_learning_rate=learning_rate,
        learning_rate=learning_rate * scale,
        model_parallel=model_parallel,
    )
