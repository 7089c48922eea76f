"""Item 12: what a model axis (`model_parallel`, Keras 3 on JAX) costs in speed and saves in
memory, and the largest model that trains in a fixed memory with it and without it.

Every job is the built-in trainer's (`backend=jax`, the MLP, item 2's synthetic data, no
checkpoints, no warmup, no dropout) in one container of the TensorFlow 2.21 image (item 9's),
one process given 4 CPU devices by XLA_FLAGS' forced host device count, so that model axes of
1, 2 and 4 are meshes of 4x1, 2x2 and 1x4 over the same devices, with the same global batch
(`global_batch_size`, one micro-batch per step):

- axis rows: the same model at M = 1, 2 and 4, interleaved (1 2 4 1 2 4) so drift in the
  machine's load hits each alike; samples/s (a run's median epoch after the first, then the
  median over runs), bytes per device as the trainer's own footprint line says them ("1.3M
  parameters, 5.3 MB; 1.3 MB per device over a model axis of 4": parsed, not recomputed), and
  the process's peak RSS (the kernel's VmHWM, sampled from the host). The reference is M = 1:
  plain data parallelism, every device a whole replica, the best a careful engineer gets
  without splitting the model.
- capacity row: each container capped at `Capacity.memory` bytes (podman/docker `--memory`,
  swap included: a cgroup limit, as an instance's memory bounds a SageMaker job); for M = 1 and
  M = 4, the MLP's two hidden layers grow by a factor sqrt(2) per job from `Capacity.width`
  (the parameter count about doubles) until the first job the kernel kills for memory, at most
  `Capacity.steps` jobs. The row: the largest parameter count that completed (the trainer's
  footprint line) at M = 4 against M = 1's. A failure that is not out of memory fails the
  item. Each step runs M = 1's job and M = 4's at once: these jobs measure memory, each under
  its own limit, not time.

On CPU the devices of one process share its memory, so its peak holds every device's share:
with M = 1 four whole replicas (weights, gradients, Adam's two moments), with M = 4 one,
split. On accelerators each device has its own memory and the same ratio is per device. The
4 devices share the machine's cores, so the samples/s say little about accelerators (where
each device computes apart and the model axis's collectives cross links); the point of these
rows is bytes per device.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.jobs import (
    RANK_PROGRAM,
    DataShape,
    PeakMemory,
    parse_metrics,
    synthetic,
    wait_for_train,
    write_job,
)
from bench.launch import log, stop
from bench.results import Measurement, median
from bench.sizes import Sizes
from scripts.local_cluster import Engine

DEVICES = 4  # forced host devices of the one process: model axes 1, 2 and 4 fit them
AXES = (1, 2, 4)
SEARCHED = (1, 4)  # the capacity search: data parallel against the widest model axis
RUN_TIMEOUT = 900
MB = 1e6  # the trainer's footprint line counts decimal megabytes (train.layouts.megabytes)
# train.layouts.footprint's line, e.g. "trainer: 1.3M parameters, 5.3 MB; 1.3 MB per device
# over a model axis of 4"
FOOTPRINT = re.compile(
    r"trainer: ([\d.]+)([KMB]?) parameters, ([\d.]+) (kB|MB); ([\d.]+) (kB|MB) per device "
    r"over a model axis of (\d+)"
)
COUNT_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9}
BYTE_UNIT = {"kB": 1e3, "MB": 1e6}


@dataclass(frozen=True)
class Footprint:
    """What the trainer said its model weighs, as it rounded it (one decimal)."""

    parameters: float
    whole_bytes: float
    device_bytes: float
    model_axis: int

    @classmethod
    def parse(cls, log_text: str) -> Footprint:
        found = FOOTPRINT.search(log_text)
        if found is None:
            raise RuntimeError(
                "the trainer printed no footprint line ('trainer: N parameters, X MB; Y MB per "
                f"device over a model axis of M'):\n{log_text[-3000:]}"
            )
        return cls(
            parameters=float(found[1]) * COUNT_SUFFIX[found[2]],
            whole_bytes=float(found[3]) * BYTE_UNIT[found[4]],
            device_bytes=float(found[5]) * BYTE_UNIT[found[6]],
            model_axis=int(found[7]),
        )


@dataclass
class ContainerRun:
    """One `train` in one container: its exit status, its log, the rank's peak RSS."""

    returncode: int
    output: str
    failure: str
    seconds: float
    peak_rss: int | None

    @property
    def out_of_memory(self) -> bool:
        """Killed by the kernel for memory: the launcher names a rank killed by signal 9 so
        (container.failure), and a container whose first process was killed exits 137."""
        return "likely out of memory" in self.failure or self.returncode == 137


def hyperparameters(
    sizes: Sizes, model_axis: int, hidden_units: str, epochs: int
) -> dict[str, str]:
    """Item 2's throughput job on the JAX stack with a model axis; the global batch fixed (so
    every mesh does the same work per step), in one micro-batch."""
    batch = str(sizes.per_device_batch)
    return {
        "backend": "jax",
        "model": "mlp",
        "hidden_units": hidden_units,
        "dropout_rate": "0",
        "epochs": str(epochs),
        "model_parallel": str(model_axis),
        "global_batch_size": batch,
        "max_device_batch_size": batch,
        "checkpoint_every_epochs": "0",
        "warmup_epochs": "0",
        "learning_rate": "0.001",
    }


def _container_pid(engine: Engine, name: str, process: subprocess.Popen[str]) -> int | None:
    """The host pid of the container's first process, once the engine started it; None when
    `podman run` ended first."""
    while process.poll() is None:
        found = engine.run("inspect", "--format", "{{.State.Pid}}", name, check=False)
        if found.returncode == 0 and found.stdout.strip().isdigit() and int(found.stdout) > 0:
            return int(found.stdout)
        time.sleep(0.1)
    return None


def _end(engine: Engine, name: str, process: subprocess.Popen[str]) -> None:
    """A container still running when its run is given up on: `run` ended, the container
    removed (the engine may leave it running without its client)."""
    if process.poll() is None:
        stop(process, 10)
        engine.run("rm", "--force", name, check=False)


def run_containers(
    engine: Engine, image: str, roots: Sequence[Path], memory: int | None = None
) -> list[ContainerRun]:
    """`train` for every job root at once, each in its own container of 4 CPU devices (capped
    at `memory` bytes, swap included, when given), to the end; each rank's peak RSS sampled
    from the host while it runs (the container's processes are the host's too)."""
    started = time.perf_counter()
    deadline = time.monotonic() + RUN_TIMEOUT
    running = []
    with contextlib.ExitStack() as stack:
        for root in roots:
            name = f"bench-model-axis-{os.getpid()}-{root.parent.name}-{root.name}"
            cap = ["--memory", str(memory), "--memory-swap", str(memory)] if memory else []
            argv = [
                engine.name,
                "run",
                "--rm",
                "--name",
                name,
                *cap,
                "-e",
                f"XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES}",
                "-v",
                f"{root}:/opt/ml",
                image,
                "train",
            ]
            log(f"item 12: {' '.join(argv)}")
            with open(root / "train.log", "w") as output:  # a file: a full pipe would block
                # in the job's folder: podman 4.3's conmon writes a file `oom` into its working
                # folder when the kernel kills a container's first process for memory
                process = subprocess.Popen(
                    argv,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=dict(engine.env),
                    text=True,
                    cwd=root,
                )
            stack.callback(_end, engine, name, process)
            pid = _container_pid(engine, name, process)
            peaks = stack.enter_context(PeakMemory(pid, RANK_PROGRAM, 0.1)) if pid else None
            running.append((root, process, peaks))
        runs = []
        for root, process, peaks in running:
            wait_for_train(process, deadline, timeout=RUN_TIMEOUT, what="item 12", root=root)
            failure = root / "output" / "failure"
            runs.append(
                ContainerRun(
                    returncode=process.returncode,
                    output=(root / "train.log").read_text(),
                    failure=failure.read_text() if failure.exists() else "",
                    seconds=time.perf_counter() - started,
                    peak_rss=max(peaks.peaks.values(), default=None) if peaks else None,
                )
            )
    return runs


@dataclass(frozen=True)
class Capacity:
    """The capacity search: the container's memory limit, the first hidden width, the most
    jobs per model axis, and each job's samples (one epoch of two steps at the size's global
    batch: the first allocates the weights, gradients and Adam's moments, the export follows)."""

    memory: int
    width: int
    steps: int
    samples: int

    def widths(self) -> list[int]:
        """Each job's width: x sqrt(2) a step (so about x2 the parameters), a multiple of 8 (a
        model axis of 4 splits it evenly)."""
        return [8 * round(self.width * math.sqrt(2) ** step / 8) for step in range(self.steps)]


# Measured here (no limit, 1 epoch of 512 samples): the process's anonymous memory peaks at
# about 0.47 GB plus 79 bytes per parameter at M = 1 (4 replicas x weights, gradients and Adam's
# 2 moments, 64 bytes, and the export's whole copy) and 38 at M = 4, about 20 of them held
# whole until 4eff697 (docs/model-parallel.md, "What a process holds"). A cgroup limit counts what
# the container's processes own (anonymous memory, the page cache they write; the launcher and
# mpirun about 0.15 GB more), not the library pages already cached from the image that VmHWM
# also counts, so a job's peak RSS may exceed the limit. Each limit sits about mid-way between
# two steps for both model axes: full, M = 1 completes 9.2 M parameters and is killed at 17.9 M,
# M = 4 completes 17.9 M and is killed at 35 M (since 4eff697: completes 35.1 M, is killed at
# 69.3 M, the search's last step); tiny, M = 1 completes 4.2 M and is killed at
# 8.4 M, M = 4 completes both of its two steps (the row says "at least").
CAPACITY_FULL = Capacity(memory=1600 * 1024**2, width=2896, steps=4, samples=512)
CAPACITY_TINY = Capacity(memory=1080 * 1024**2, width=2048, steps=2, samples=64)


@dataclass
class Step:
    """One job of the capacity search."""

    width: int
    completed: bool
    parameters: float | None  # the trainer's footprint line (None: killed before it said)
    peak_rss: int | None
    seconds: float
    failure: str  # the launcher's reason for a job killed for memory

    def details(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "completed": self.completed,
            "parameters": self.parameters,
            "peak_rss_bytes": self.peak_rss,
            "seconds": round(self.seconds, 1),
            **({"failure": self.failure.strip()} if self.failure else {}),
        }


@dataclass
class Search:
    """One model axis's jobs of the capacity search, in order; it ends at its first job
    killed for memory."""

    model_axis: int
    steps: list[Step] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        return any(not step.completed for step in self.steps)

    def largest(self) -> Step | None:
        done = [step for step in self.steps if step.completed]
        return done[-1] if done else None

    def record(self, width: int, run: ContainerRun) -> None:
        """A completed job, or one killed for memory; RuntimeError for any other failure (a
        broken job is not a size limit)."""
        found = FOOTPRINT.search(run.output)
        parameters = Footprint.parse(run.output).parameters if found else None
        if run.returncode and not run.out_of_memory:
            raise RuntimeError(
                f"model_parallel={self.model_axis}, hidden width {width}: the job failed with "
                f"exit code {run.returncode}, not for memory: {run.failure or run.output[-3000:]}"
            )
        self.steps.append(
            Step(width, run.returncode == 0, parameters, run.peak_rss, run.seconds, run.failure)
        )


def search_capacity(
    engine: Engine, image: str, capacity: Capacity, sizes: Sizes, workdir: Path
) -> list[Search]:
    """For M = 1 and M = 4, jobs of growing width under the memory limit until each is killed
    for memory (or `capacity.steps` ran); both model axes' jobs of a step run at once."""
    data = synthetic(DataShape(capacity.samples, sizes.features))
    searches = [Search(axis) for axis in SEARCHED]
    for width in capacity.widths():
        active = [search for search in searches if not search.ended]
        if not active:
            break
        roots = []
        for search in active:
            root = workdir / f"capacity-{width}" / f"m{search.model_axis}"
            shutil.rmtree(root, ignore_errors=True)
            job = hyperparameters(sizes, search.model_axis, f"{width},{width}", epochs=1)
            roots.append(write_job(root, job, data))
        log(f"item 12: capacity, width {width}, model axes {[s.model_axis for s in active]}")
        for search, run in zip(active, run_containers(engine, image, roots, capacity.memory)):
            search.record(width, run)
    for search in searches:
        if search.largest() is None:
            raise RuntimeError(
                f"model_parallel={search.model_axis}: even the first width "
                f"({capacity.width}) was killed for memory under {capacity.memory / 2**20:.0f} "
                "MiB: start the search smaller"
            )
    return searches


@dataclass
class Axis:
    """The throughput jobs of one model axis."""

    model_axis: int
    throughputs: list[float | None] = field(default_factory=list)
    footprints: list[Footprint] = field(default_factory=list)
    peaks: list[int | None] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def throughput(self) -> float | None:
        return median(self.throughputs)

    def device_bytes(self) -> float:
        return self.footprints[-1].device_bytes

    def peak_mib(self) -> float | None:
        return median(peak / 2**20 for peak in self.peaks if peak)

    def details(self) -> dict[str, Any]:
        last = self.footprints[-1]
        return {
            "model_axis": self.model_axis,
            "run_samples_per_sec": self.throughputs,
            "parameters": last.parameters,
            "whole_bytes": last.whole_bytes,
            "device_bytes": last.device_bytes,
            "peak_rss_bytes": self.peaks,
            "run_seconds": [round(s, 1) for s in self.seconds],
        }


def run_axes(engine: Engine, image: str, sizes: Sizes, workdir: Path) -> list[Axis]:
    """Item 2's model at every model axis, interleaved, `sizes.repeats` times, one at a time."""
    data = synthetic(DataShape(sizes.samples, sizes.features))
    axes = [Axis(axis) for axis in AXES]
    for repeat in range(sizes.repeats):
        for axis in axes:
            root = workdir / f"axis{axis.model_axis}-{repeat}" / "job"
            shutil.rmtree(root, ignore_errors=True)
            job = hyperparameters(sizes, axis.model_axis, sizes.hidden_units, sizes.epochs)
            write_job(root, job, data)
            log(f"item 12: model axis {axis.model_axis}, run {repeat + 1}")
            [run] = run_containers(engine, image, [root])
            if run.returncode:
                raise RuntimeError(
                    f"model_parallel={axis.model_axis}: the job failed with exit code "
                    f"{run.returncode}: {run.failure or run.output[-3000:]}"
                )
            footprint = Footprint.parse(run.output)
            if footprint.model_axis != axis.model_axis:
                raise RuntimeError(
                    f"asked for model_parallel={axis.model_axis}, the trainer reports a model "
                    f"axis of {footprint.model_axis}"
                )
            epochs = parse_metrics(run.output)[1:]  # the first includes tracing
            axis.throughputs.append(median(e.get("samples_per_sec") for e in epochs))
            axis.footprints.append(footprint)
            axis.peaks.append(run.peak_rss)
            axis.seconds.append(run.seconds)
    return axes


def axis_rows(axes: list[Axis], sizes: Sizes) -> list[Measurement]:
    reference, model = axes[0], f"mlp {sizes.features}-{sizes.hidden_units.replace(',', '-')}-10"
    note = (
        f"{model}, global batch {sizes.per_device_batch}; one process of {DEVICES} CPU devices "
        "(forced host devices) sharing the machine's cores: the point is bytes per device"
    )
    details = {f"model_axis_{axis.model_axis}": axis.details() for axis in axes}
    rows = []
    for axis in axes[1:]:
        mesh = f"{DEVICES // axis.model_axis}x{axis.model_axis}"
        rows += [
            Measurement(
                item=12,
                metric=f"model axis {axis.model_axis} (mesh {mesh}): samples/s",
                unit="samples/s",
                value=axis.throughput(),
                reference=reference.throughput(),
                reference_name="model axis 1 (data parallel)",
                note=note,
                samples=tuple(axis.throughputs),
                details=details,
            ),
            Measurement(
                item=12,
                metric=f"model axis {axis.model_axis}: bytes per device (trainer's log)",
                unit="MB",
                value=axis.device_bytes() / MB,
                reference=reference.device_bytes() / MB,
                reference_name="model axis 1 (data parallel)",
                note="weights; biases stay whole",
            ),
            Measurement(
                item=12,
                metric=f"model axis {axis.model_axis}: peak RSS of the process",
                unit="MB",
                value=axis.peak_mib(),
                reference=reference.peak_mib(),
                reference_name="model axis 1 (data parallel)",
                note=f"the process's {DEVICES} devices share its memory",
                samples=tuple(peak / 2**20 for peak in axis.peaks if peak),
            ),
        ]
    return rows


def capacity_row(searches: list[Search], capacity: Capacity) -> Measurement:
    whole, split = searches[0], searches[-1]
    largest = {search.model_axis: search.largest() for search in searches}
    open_ended = [s.model_axis for s in searches if not s.ended]
    note = f"hidden width x sqrt(2) a job from {capacity.width}"
    if open_ended:
        note += (
            f"; model axis {', '.join(map(str, open_ended))} never ran out of memory within "
            f"{capacity.steps} jobs: at least this"
        )
    split_largest, whole_largest = largest[split.model_axis], largest[whole.model_axis]
    return Measurement(
        item=12,
        metric=(
            f"largest model trained in {capacity.memory / 2**20:,.0f} MiB per process: model "
            f"axis {split.model_axis} vs 1"
        ),
        unit="parameters",
        value=split_largest.parameters if split_largest else None,
        reference=whole_largest.parameters if whole_largest else None,
        reference_name="model axis 1 (data parallel)",
        note=note,
        details={
            "memory_limit_bytes": capacity.memory,
            **{
                f"model_axis_{search.model_axis}": [step.details() for step in search.steps]
                for search in searches
            },
        },
    )


def measure(sizes: Sizes, capacity: Capacity, workdir: Path, image: str) -> list[Measurement]:
    engine = Engine.detect()
    workdir.mkdir(parents=True, exist_ok=True)
    axes = run_axes(engine, image, sizes, workdir)
    searches = search_capacity(engine, image, capacity, sizes, workdir)
    return [*axis_rows(axes, sizes), capacity_row(searches, capacity)]
