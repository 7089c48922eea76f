"""The built-in trainer's device mesh on Keras 3 / JAX: data x model, as arithmetic.

`model_parallel` (a hyperparameter) is the size of the mesh's model axis: each variable the
layout splits is split over that many devices, and the job's D devices form D / M data-parallel
replicas. Devices are laid out in JAX's order (process 0's first), so a model axis no larger
than a process's L devices stays inside each process, and a larger one spans M / L processes,
which then hold the same slice of every batch: they read the same input, as one reader. So the
model axis must divide a process's devices or be a multiple of them, and divide the job's
devices. The launcher checks this before starting anything (from the GPUs it gives each
process, or on CPU from XLA_FLAGS' forced device count) and every process again from what JAX
found. Pure arithmetic, no JAX.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# How tests (and users on CPU) give one process several JAX devices.
FORCED_DEVICES = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def forced_devices(environ: Mapping[str, str]) -> int:
    """Devices of each CPU process: XLA_FLAGS' forced host device count, else 1."""
    found = FORCED_DEVICES.findall(environ.get("XLA_FLAGS", ""))
    return max(int(found[-1]), 1) if found else 1


@dataclass(frozen=True)
class Mesh:
    processes: int
    devices_per_process: int
    model_parallel: int = 1

    @property
    def devices(self) -> int:
        return self.processes * self.devices_per_process

    @property
    def replicas(self) -> int:
        """The data axis: data-parallel replicas of the model."""
        return self.devices // self.model_parallel

    @property
    def group(self) -> int:
        """Processes that hold one replica's slice of the batch together (a model axis across
        them) and so read the same input: 1 when the model axis stays inside each process."""
        return max(1, self.model_parallel // self.devices_per_process)

    @property
    def readers(self) -> int:
        """Distinct shares of the input: what the batch plan counts as data-parallel
        replicas (the global batch and the learning rate's linear scaling)."""
        return self.processes // self.group

    def reader(self, rank: int) -> int:
        return rank // self.group

    def problem(self) -> str | None:
        """What keeps this mesh from being laid out, said with what to change; None if it can."""
        model, local, devices = self.model_parallel, self.devices_per_process, self.devices
        if devices % model:
            fitting = [size for size in range(1, devices + 1) if devices % size == 0]
            return (
                f"model_parallel={model} does not divide the job's {devices} device(s) "
                f"({self.processes} process(es) x {local}); use one of "
                f"{', '.join(map(str, fitting))}"
            )
        if local % model and model % local:
            return (
                f"model_parallel={model} neither divides each process's {local} device(s) nor "
                f"is a multiple of them, so a model axis would cut a process's devices "
                f"unevenly; use a divisor or a multiple of {local}"
            )
        return None
