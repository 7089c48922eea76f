"""Item 1: allreduce bus bandwidth, Horovod vs raw MPI_Allreduce vs a memory copy.

Two ranks started with the launcher's own mpirun options (container.mpirun: ob1, vader
shared memory without single-copy, exactly what `train` passes) and the environment it gives
CPU ranks (container.plan.CPU_RANK_ENV: MPI yields when idle, a 5 ms Horovod cycle) run, for
each message size, on the same float32 buffers:
- `MPI_Allreduce` (SUM, out of place) through mpi4py: the reference;
- Horovod as the trainer uses it: `hvd.allreduce(..., op=Average)` inside a tf.function, with
  tensor fusion on (Horovod's defaults), once as one tensor and once as the same bytes split
  into `PIECES` tensors reduced in one step (what DistributedOptimizer does with a model's
  gradients: the background thread fuses them into one buffer);
- a local memory copy of the same size (numpy copyto) on each rank at the same time: the
  physical ceiling (shared-memory MPI moves every byte through memory copies).
MPI and the copy are measured for every size before Horovod starts; Horovod's background
thread (it coordinates the ranks with an MPI collective every HOROVOD_CYCLE_TIME) is part of
Horovod's cost, and would otherwise slow the reference down as well.

Bus bandwidth = size / time * 2(n-1)/n (nccl-tests' definition), n = 2 ranks. Each timing is
the slowest rank's mean over as many calls as fill ~50 ms (from a timed warm-up call); the
reported number is the median of `repeats` timings (at least 3 when a variant would take
longer than 3 s). Sizes not started within the time budget are reported as skipped.

    mpirun ... python -m mpi4py -m bench.allreduce OUT.json REPEATS BUDGET SIZE ...
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.launch import mpirun_argv, run
from bench.results import Measurement, Target, median
from container.plan import CPU_RANK_ENV

PIECES = 8
KB, MB = 1024, 1024 * 1024
TIMING_SECONDS = 0.05  # work per timed repeat
VARIANT_SECONDS = 3.0  # fewer repeats (down to MIN_REPEATS) when a variant would take longer
MIN_REPEATS = 3
MAX_ITERATIONS = 200


def bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> float:
    """Bytes per second on the bus, as nccl-tests define it for allreduce."""
    return size_bytes / seconds * 2 * (ranks - 1) / ranks


def iterations_for(warm_seconds: float, target_seconds: float) -> int:
    """Calls per timing: about `target_seconds` of work, so a 4 KB allreduce is not timed by
    the clock's resolution and a 256 MB one does not take minutes."""
    return max(1, min(MAX_ITERATIONS, int(target_seconds / max(warm_seconds, 1e-6))))


def _timed(comm: Any, call: Callable[[], object], repeats: int) -> tuple[list[float], int]:
    """(per repeat the slowest rank's seconds per call, calls per repeat). Every rank takes
    the same decisions: they come from MPI.MAX of the ranks' warm-up timings."""
    from mpi4py import MPI

    call()  # warm up: first-touch pages, Horovod's negotiation cache, tf.function tracing
    comm.Barrier()
    started = time.perf_counter()
    call()
    warm = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    iterations = iterations_for(warm, TIMING_SECONDS)
    repeats = min(repeats, max(MIN_REPEATS, int(VARIANT_SECONDS / (warm * iterations))))
    timings = []
    for _ in range(repeats):
        comm.Barrier()
        started = time.perf_counter()
        for _ in range(iterations):
            call()
        elapsed = (time.perf_counter() - started) / iterations
        timings.append(comm.allreduce(elapsed, op=MPI.MAX))
    return timings, iterations


def _over_budget(comm: Any, began: float, budget: float) -> bool:
    """Rank 0 decides, so every rank skips the same sizes: a loaded machine can make one
    256 MB allreduce take seconds instead of a tenth of one."""
    return bool(comm.bcast(time.perf_counter() - began > budget, root=0))


def rank_main(out: Path, sizes: list[int], repeats: int, budget: float) -> None:
    """MPI and memcpy first, before Horovod starts (its background thread would compete with
    them: that is part of Horovod's cost, not of MPI's), then Horovod on the same data."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    began = time.perf_counter()
    results = {}
    for size in sizes:
        if _over_budget(comm, began, budget / 2):
            results[size] = {"bytes": size, "skipped": f"time budget of {budget:g} s used up"}
            continue
        send = np.full(size // 4, comm.rank + 1, dtype=np.float32)
        receive = np.empty_like(send)
        mpi, iterations = _timed(comm, partial(comm.Allreduce, send, receive, op=MPI.SUM), repeats)
        if not np.all(receive == sum(range(1, comm.size + 1))):
            raise RuntimeError(f"MPI_Allreduce of {size} bytes returned a wrong sum")
        memcpy, _ = _timed(comm, partial(np.copyto, receive, send), repeats)
        results[size] = {
            "bytes": size,
            "mpi_iterations": iterations,
            "mpi_seconds": mpi,
            "memcpy_seconds": memcpy,
        }

    from train.runtime import start_horovod  # the trainer's own Horovod start-up

    start_horovod()
    import horovod.tensorflow as hvd
    import tensorflow as tf

    for size, entry in results.items():
        if "skipped" in entry:
            continue
        if _over_budget(comm, began, budget):
            entry["skipped"] = f"time budget of {budget:g} s used up"
            continue
        send = np.full(size // 4, comm.rank + 1, dtype=np.float32)
        tensor = tf.constant(send)
        # The closures below are traced and run within this iteration: `size` is the current one.
        single_fn = tf.function(
            lambda t: hvd.allreduce(t, op=hvd.Average, name=f"one{size}")  # noqa: B023
        )
        entry["horovod_seconds"], _ = _timed(comm, partial(single_fn, tensor), repeats)
        expected = sum(range(1, comm.size + 1)) / comm.size
        if not np.allclose(single_fn(tensor).numpy()[:4], expected):
            raise RuntimeError(f"Horovod allreduce of {size} bytes returned a wrong average")
        pieces = [tf.constant(part) for part in np.array_split(send, PIECES) if len(part)]

        def fused(*tensors: Any) -> list[Any]:
            return [
                hvd.allreduce(t, op=hvd.Average, name=f"piece{size}_{i}")  # noqa: B023
                for i, t in enumerate(tensors)
            ]

        fused_fn = tf.function(fused)
        entry["horovod_fused_seconds"], _ = _timed(comm, partial(fused_fn, *pieces), repeats)
        del tensor, pieces
    if comm.rank == 0:
        out.write_text(
            json.dumps({"ranks": comm.size, "pieces": PIECES, "sizes": list(results.values())})
        )


def size_label(size_bytes: int) -> str:
    return f"{size_bytes // MB} MB" if size_bytes >= MB else f"{size_bytes // KB} KB"


TARGET_FROM = 4 * MB
RANKS = 2


def measure(
    sizes: Sequence[int],
    repeats: int,
    workdir: Path,
    extra_mpi_options: str = "",
    budget: float = 150.0,
) -> list[Measurement]:
    """Run the ranks once over every size; one row per size, plus the memory-copy ceiling.
    Sizes not reached within `budget` seconds get a row without a value that says so."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "allreduce.json"
    out.unlink(missing_ok=True)
    argv = mpirun_argv(
        RANKS,
        "bench.allreduce",
        [str(out), str(repeats), f"{budget:g}", *map(str, sizes)],
        CPU_RANK_ENV,
        extra_mpi_options,
    )  # the trainer's CPU rank settings
    run(argv, timeout=budget + 240, what="allreduce")
    raw = json.loads(out.read_text())
    rows = []
    for entry in raw["sizes"]:
        size = entry["bytes"]
        metric = f"allreduce busbw {size_label(size)}, Horovod ({raw['pieces']} tensors fused)"
        target = Target("ratio", ">=", 0.9) if size >= TARGET_FROM else None
        if "skipped" in entry:
            rows.append(
                Measurement(
                    item=1,
                    metric=metric,
                    unit="GB/s",
                    value=None,
                    reference_name="MPI_Allreduce",
                    target=target,
                    note=f"skipped: {entry['skipped']}",
                    details=entry,
                )
            )
            continue
        rate = {
            key: median(bus_bandwidth(size, t, raw["ranks"]) / 1e9 for t in entry[key])
            for key in ("mpi_seconds", "horovod_seconds", "horovod_fused_seconds", "memcpy_seconds")
        }
        rows.append(
            Measurement(
                item=1,
                metric=metric,
                unit="GB/s",
                value=rate["horovod_fused_seconds"],
                reference=rate["mpi_seconds"],
                reference_name="MPI_Allreduce",
                target=target,
                note=f"one tensor {rate['horovod_seconds']:.3g} GB/s; "
                f"memcpy {rate['memcpy_seconds']:.3g} GB/s",
                samples=tuple(
                    bus_bandwidth(size, t, raw["ranks"]) / 1e9
                    for t in entry["horovod_fused_seconds"]
                ),
                details={**entry, "busbw_gb_per_s": rate},
            )
        )
    measured = [entry for entry in raw["sizes"] if "skipped" not in entry]
    largest = measured[-1]
    ceiling = median(largest["bytes"] / t / 1e9 for t in largest["memcpy_seconds"])
    best_mpi = max(r.reference for r in rows if r.reference is not None)
    rows.append(
        Measurement(
            item=1,
            metric=f"memory-copy bandwidth {size_label(largest['bytes'])} (ceiling)",
            unit="GB/s",
            value=best_mpi,
            reference=ceiling,
            reference_name="memcpy, both ranks at once",
            note="value: the best MPI_Allreduce busbw of any size",
        )
    )
    return rows


if __name__ == "__main__":
    rank_main(
        Path(sys.argv[1]), [int(s) for s in sys.argv[4:]], int(sys.argv[2]), float(sys.argv[3])
    )
