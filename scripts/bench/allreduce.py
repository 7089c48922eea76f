"""Item 1: allreduce bus bandwidth, Horovod vs raw MPI_Allreduce vs a memory copy.

Two ranks started with the launcher's own mpirun options (container.mpirun: ob1, vader
shared memory without single-copy, exactly what `train` passes) run, for each message size,
on the same float32 buffers:
- `MPI_Allreduce` (SUM, out of place) through mpi4py: the reference;
- Horovod as the trainer uses it: `hvd.allreduce(..., op=Average)` inside a tf.function, with
  tensor fusion on (Horovod's defaults), once as one tensor and once as the same bytes split
  into `PIECES` tensors reduced in one step (what DistributedOptimizer does with a model's
  gradients: the background thread fuses them into one buffer);
- a local memory copy of the same size (numpy copyto) on each rank at the same time: the
  physical ceiling (shared-memory MPI moves every byte through memory copies).

Bus bandwidth = size / time * 2(n-1)/n (nccl-tests' definition), n = 2 ranks. Each timing is
the slowest rank's mean over `iterations` calls; the reported number is the median of
`repeats` such timings.

    mpirun ... python -m mpi4py -m scripts.bench.allreduce OUT.json SIZE [SIZE ...]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Sequence

from scripts.bench.launch import mpirun_argv, run
from scripts.bench.results import Measurement, Target, median

PIECES = 8
KB, MB = 1024, 1024 * 1024
RUN_TIMEOUT = 400


def bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> float:
    """Bytes per second on the bus, as nccl-tests define it for allreduce."""
    return size_bytes / seconds * 2 * (ranks - 1) / ranks


def iterations_for(size_bytes: int) -> int:
    """Enough calls that one timing lasts ~10 ms or more even for the smallest messages."""
    return max(2, min(200, (16 * MB) // max(size_bytes, 1)))


def _timed(comm, call, iterations: int, repeats: int) -> list[float]:
    """Per repeat: the slowest rank's seconds per call."""
    from mpi4py import MPI

    call()  # warm up: first-touch pages, Horovod's negotiation cache, tf.function tracing
    timings = []
    for _ in range(repeats):
        comm.Barrier()
        started = time.perf_counter()
        for _ in range(iterations):
            call()
        elapsed = (time.perf_counter() - started) / iterations
        timings.append(comm.allreduce(elapsed, op=MPI.MAX))
    return timings


def rank_main(out: Path, sizes: list[int], repeats: int) -> None:
    import numpy as np
    from mpi4py import MPI

    from train.runtime import start_horovod  # the trainer's own Horovod start-up

    start_horovod()
    import horovod.tensorflow as hvd
    import tensorflow as tf

    comm = MPI.COMM_WORLD
    results = []
    for size in sizes:
        count = size // 4
        iterations = iterations_for(size)
        send = np.full(count, comm.rank + 1, dtype=np.float32)
        receive = np.empty_like(send)
        mpi = _timed(comm, lambda: comm.Allreduce(send, receive, op=MPI.SUM),
                     iterations, repeats)
        if not np.all(receive == sum(range(1, comm.size + 1))):
            raise RuntimeError(f"MPI_Allreduce of {size} bytes returned a wrong sum")
        copy_target = np.empty_like(send)
        memcpy = _timed(comm, lambda: np.copyto(copy_target, send), iterations, repeats)
        del copy_target, receive

        tensor = tf.constant(send)
        single_fn = tf.function(lambda t: hvd.allreduce(t, op=hvd.Average, name=f"one{size}"))
        single = _timed(comm, lambda: single_fn(tensor), iterations, repeats)
        expected = sum(range(1, comm.size + 1)) / comm.size
        if not np.allclose(single_fn(tensor).numpy()[:4], expected):
            raise RuntimeError(f"Horovod allreduce of {size} bytes returned a wrong average")
        pieces = [tf.constant(part) for part in np.array_split(send, PIECES)
                  if len(part)] if count >= PIECES else [tensor]

        @tf.function
        def fused_fn(*tensors):
            return [hvd.allreduce(t, op=hvd.Average, name=f"piece{size}_{i}")
                    for i, t in enumerate(tensors)]

        fused = _timed(comm, lambda: fused_fn(*pieces), iterations, repeats)
        del tensor, pieces
        results.append({"bytes": size, "iterations": iterations, "mpi_seconds": mpi,
                        "horovod_seconds": single, "horovod_fused_seconds": fused,
                        "memcpy_seconds": memcpy})
    if comm.rank == 0:
        out.write_text(json.dumps({"ranks": comm.size, "pieces": PIECES, "sizes": results}))


def size_label(size_bytes: int) -> str:
    return f"{size_bytes // MB} MB" if size_bytes >= MB else f"{size_bytes // KB} KB"


TARGET_FROM = 4 * MB
RANKS = 2


def measure(sizes: Sequence[int], repeats: int, workdir: Path,
            extra_mpi_options: str = "") -> list[Measurement]:
    """Run the ranks once over every size; one row per size, plus the memory-copy ceiling."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "allreduce.json"
    out.unlink(missing_ok=True)
    argv = mpirun_argv(RANKS, "scripts.bench.allreduce",
                       [str(out), str(repeats), *map(str, sizes)], {}, extra_mpi_options)
    run(argv, timeout=RUN_TIMEOUT, what="allreduce")
    raw = json.loads(out.read_text())
    rows = []
    for entry in raw["sizes"]:
        size = entry["bytes"]
        rate = {key: median(bus_bandwidth(size, t, raw["ranks"]) / 1e9 for t in entry[key])
                for key in ("mpi_seconds", "horovod_seconds", "horovod_fused_seconds",
                            "memcpy_seconds")}
        rows.append(Measurement(
            item=1, metric=f"allreduce busbw {size_label(size)}, Horovod ({raw['pieces']} "
                           f"tensors fused)", unit="GB/s",
            value=rate["horovod_fused_seconds"], reference=rate["mpi_seconds"],
            reference_name="MPI_Allreduce",
            target=Target("ratio", ">=", 0.9) if size >= TARGET_FROM else None,
            note=f"one tensor {rate['horovod_seconds']:.3g} GB/s; "
                 f"memcpy {rate['memcpy_seconds']:.3g} GB/s",
            samples=tuple(bus_bandwidth(size, t, raw["ranks"]) / 1e9
                          for t in entry["horovod_fused_seconds"]),
            details={**entry, "busbw_gb_per_s": rate}))
    largest = raw["sizes"][-1]
    ceiling = median(largest["bytes"] / t / 1e9 for t in largest["memcpy_seconds"])
    best_mpi = max(r.reference for r in rows if r.reference is not None)
    rows.append(Measurement(
        item=1, metric=f"memory-copy bandwidth {size_label(largest['bytes'])} (ceiling)",
        unit="GB/s", value=best_mpi, reference=ceiling,
        reference_name="memcpy, both ranks at once",
        note="value: the best MPI_Allreduce busbw of any size"))
    return rows


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]), [int(s) for s in sys.argv[3:]], int(sys.argv[2]))
