"""What the host offers the server, read without importing TensorFlow: CPU cores and GPUs.

The gunicorn master decides how many workers to start before any worker exists, and must not
import TensorFlow to do it (see serve.server), so GPUs are counted from the NVIDIA driver's
/proc entries, as `nvidia-smi` would list them.

On a CPU host one worker per core keeps every core busy: a worker's Python (HTTP, decoding)
runs under one interpreter lock, so a lone worker leaves the other cores idle between model
calls. Each worker's TensorFlow still gets every core for one model call (one inter-op
thread, so a call's ops run one after another, each spread over the cores): a lone request
then runs as fast as the machine allows (a CNN's one-row call 2.5 -> 2.0 ms on 2 cores), and
under load the workers rarely compute at the same moment, since each spends most of its time
in Python between calls. Measured on 2 cores against one intra-op thread per worker, with
`make bench-serve`'s CNN: 1.2-1.7x the requests/s at concurrency 1 and 8, the same at 64,
and a lower p99 at every concurrency; the MLP was unchanged. On a GPU host one worker per
GPU, each seeing only its own GPU, keeps every GPU fed without two processes contending for
one device's memory.

TensorFlow turns its oneDNN kernels on by default on CPUs with AVX-512 VNNI or AMX. They pay
off on training's large batches (container.plan turns them on for CPU ranks), but serving
calls the model with a few rows at a time, where they cost more than they save: the bench CNN's
one-row call took 3.2-4.4 ms of wall time (4.0-4.3 ms of CPU) with them and 1.3-2.1 ms (1.5-2.0
ms of CPU) without, 32 rows 11-16 ms against 9-13, the MLP's 8 and 32 rows 0.15-0.34 ms
against 0.11-0.22, its single row the same. GPU hosts run the model on the GPU either way.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def cpu_count() -> int:
    """Cores this process may run on (its affinity mask, which containers narrow)."""
    return len(os.sched_getaffinity(0))


def gpu_count(gpus_dir: Path = NVIDIA_GPUS) -> int:
    """GPUs the NVIDIA driver exposes (0 without the driver)."""
    try:
        return sum(1 for _ in gpus_dir.iterdir())
    except OSError:
        return 0


def default_workers(cpus: int, gpus: int) -> int:
    """One worker per GPU on GPU hosts, else one per core."""
    return gpus or cpus


def tensorflow_environment(cpus: int) -> dict[str, str]:
    """Environment for one worker's TensorFlow: every core for one call, and TensorFlow's own
    CPU kernels rather than oneDNN's."""
    return {
        "TF_NUM_INTRAOP_THREADS": str(cpus),
        "TF_NUM_INTEROP_THREADS": "1",
        "OMP_NUM_THREADS": str(cpus),
        "TF_ENABLE_ONEDNN_OPTS": "0",
    }


def worker_core(slot: int, cores: Collection[int]) -> int:
    """The core for the Python threads of the worker in `slot`: the slots go round the cores
    this process may run on."""
    return sorted(cores)[slot % len(cores)]


def lowest_free(held: Collection[int]) -> int:
    """The lowest slot not in `held`: a new worker's, which a worker that exited frees for its
    replacement."""
    return min(set(range(len(held) + 1)) - set(held))


class WorkerSlots:
    """The slot (and so the core of its Python threads, and its GPU) of each live worker, kept
    in the gunicorn master through its documented `pre_fork` and `child_exit` server hooks; the
    forked worker inherits its own."""

    def __init__(self) -> None:
        self._held: set[int] = set()

    def assign(self, server: Any, worker: Any) -> None:
        worker.slot = lowest_free(self._held)
        self._held.add(worker.slot)

    def free(self, server: Any, worker: Any) -> None:
        self._held.discard(worker.slot)
