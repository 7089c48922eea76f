"""What the host offers the server, read without importing TensorFlow: CPU cores and GPUs.

The gunicorn master decides how many workers to start before any worker exists, and must not
import TensorFlow to do it (see serve.server), so GPUs are counted from the NVIDIA driver's
/proc entries, as `nvidia-smi` would list them.

On a CPU host one worker per core keeps every core busy: a worker's Python (HTTP, decoding)
runs under one interpreter lock, so a lone worker leaves the other cores idle between model
calls. Each worker's TensorFlow then gets its share of the cores for its thread pools instead
of one thread per core each, so that workers do not fight over the cores. On a GPU host one
worker per GPU, each seeing only its own GPU, keeps every GPU fed without two processes
contending for one device's memory.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

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


def tensorflow_threads(cpus: int, workers: int) -> dict[str, str]:
    """Environment sizing one worker's TensorFlow thread pools to its share of the cores."""
    share = max(1, cpus // workers)
    return {"TF_NUM_INTRAOP_THREADS": str(share), "TF_NUM_INTEROP_THREADS": str(min(2, share)),
            "OMP_NUM_THREADS": str(share)}


def free_gpu(assigned: Collection[int], gpus: int) -> int:
    """The GPU for a new worker: the lowest not held by a live worker (round robin if all are)."""
    for gpu in range(gpus):
        if gpu not in assigned:
            return gpu
    return len(assigned) % gpus
