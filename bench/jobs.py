"""Synthetic SageMaker jobs for the trainer benchmarks, and running the real `train` on them.

The data is a learnable synthetic classification set (Gaussian features, the label is the
argmax of a fixed random linear map), big enough that an epoch lasts seconds, written as
channel files the way a user would upload them (NPZ by default, CSV for the reader
benchmark). Runs go through the real launcher (`train --ml-root`): mpirun, Horovod, the
built-in trainer. While a job runs, every rank's peak RSS (the kernel's VmHWM) is sampled.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.launch import TRAIN, log, stop
from job import protocol
from job.paths import MlPaths
from job.sagemaker_config import Channel, JobConfig, ResourceConfig, write_job_config

CLASSES = 10
RANK_PROGRAM = "train.rank_main"  # the rank processes' `-m` module


@dataclass(frozen=True)
class DataShape:
    samples: int
    features: int
    classes: int = CLASSES


def synthetic(shape: DataShape, seed: int = 0) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((shape.samples, shape.features), dtype=np.float32)
    mixing = np.random.default_rng(1).standard_normal((shape.features, shape.classes))
    return x, (x @ mixing).argmax(axis=1).astype(np.int64)


def write_npz(
    folder: Path, x: npt.NDArray[Any], y: npt.NDArray[Any], name: str = "part-0.npz"
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / name, x=x, y=y)
    return folder / name


def write_csv(
    folder: Path, x: npt.NDArray[Any], y: npt.NDArray[Any], name: str = "part-0.csv"
) -> Path:
    """Label first, no header: the format SageMaker's built-in algorithms read."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    np.savetxt(path, np.column_stack([y, x]), delimiter=",", fmt="%.6g")
    return path


def write_job(
    root: Path,
    hyperparameters: Mapping[str, Any],
    data: tuple[npt.NDArray[Any], npt.NDArray[Any]],
    *,
    hosts: Sequence[str] = ("algo-1",),
    current_host: str = "algo-1",
) -> Path:
    """An /opt/ml-like tree with a `train` channel only (no validation: epochs time training)."""
    paths = MlPaths(root)
    write_job_config(
        JobConfig(
            paths,
            ResourceConfig(current_host, tuple(hosts), "lo"),
            dict(hyperparameters),
            {"train": Channel("train", "application/x-npz")},
        )
    )
    write_npz(paths.channel("train"), *data)
    return root


def parse_metrics(output: str) -> list[dict[str, float]]:
    """The trainer's METRICS lines (job.protocol), in order."""
    return [
        values
        for line in output.splitlines()
        if (values := protocol.parse_metrics(line)) is not None
    ]


def peak_rss(pid: int) -> int | None:
    """The kernel's high-water mark of a process's resident memory, in bytes."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def rank_pid(rank: int, root: Path) -> int | None:
    """The process of rank `rank` of the job whose ml root is `root` (the ranks' TRAIN_ML_ROOT),
    found by its environment: the ranks of another host are children of an orted that
    daemonized, not of that host's launcher."""
    wanted = {f"OMPI_COMM_WORLD_RANK={rank}".encode(), f"TRAIN_ML_ROOT={root}".encode()}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and RANK_PROGRAM in _cmdline(int(entry)):
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if wanted <= set(environ.read().split(b"\0")):
                        return int(entry)
            except OSError:
                continue
    return None


class PeakMemory:
    """Samples the VmHWM of every descendant of `pid` whose command line has the word
    `marker` (every descendant when it is None), leaving mpirun itself out."""

    def __init__(self, pid: int, marker: str | None, interval: float = 0.2):
        self.pid, self.marker, self.interval = pid, marker, interval
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        for pid in _descendants(self.pid):
            argv = _cmdline(pid).split()
            if argv and (self.marker is None or self.marker in argv) and "mpirun" not in argv[0]:
                peak = peak_rss(pid)
                if peak:
                    self.peaks[pid] = max(self.peaks.get(pid, 0), peak)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()


@dataclass
class TrainRun:
    """What one `train` run printed and measured."""

    seconds: float
    epochs: list[dict[str, float]]
    rank_peak_rss: list[int] = field(default_factory=list)
    output: str = ""

    def steady_samples_per_sec(self) -> list[float]:
        """Per-epoch throughput without the first epoch (it includes tf.function tracing)."""
        values = [e["samples_per_sec"] for e in self.epochs if "samples_per_sec" in e]
        return values[1:] if len(values) > 1 else values


def wait_for_train(
    process: subprocess.Popen[Any], deadline: float, *, timeout: float, what: str, root: Path
) -> None:
    """Wait for `process` (the `train` of the job in `root`) until `deadline` (monotonic);
    RuntimeError pointing at its log when it runs past it (its caller stops it)."""
    try:
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"{what}: train did not finish within {timeout:.0f} s; see {root / 'train.log'}"
        ) from None


def run_trains(roots: Sequence[Path], *, timeout: float, what: str) -> list[TrainRun]:
    """`train --ml-root ROOT` for every root at once, to the end; RuntimeError naming the
    failed job with its failure file when one fails."""
    started = time.perf_counter()
    deadline = time.monotonic() + timeout
    processes, runs = [], []
    with contextlib.ExitStack() as stack:
        for root in roots:
            argv = [str(TRAIN), "--ml-root", str(root)]
            log(f"{what}: {' '.join(argv)}")
            output = stack.enter_context(open(root / "train.log", "w"))  # a full pipe blocks
            process = subprocess.Popen(
                argv,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            stack.callback(stop, process, 10)
            processes.append(
                (root, process, stack.enter_context(PeakMemory(process.pid, RANK_PROGRAM)))
            )
        for root, process, memory in processes:
            wait_for_train(process, deadline, timeout=timeout, what=what, root=root)
            runs.append((root, process, time.perf_counter() - started, memory.peaks))
    results = []
    for root, process, seconds, peaks in runs:
        text = (root / "train.log").read_text()
        if process.returncode != 0:
            failure = root / "output" / "failure"
            reason = failure.read_text() if failure.exists() else text[-3000:]
            raise RuntimeError(
                f"{what}: train --ml-root {root} failed with exit code "
                f"{process.returncode}: {reason}"
            )
        epochs = parse_metrics(text)
        if not epochs:
            raise RuntimeError(f"{what}: train printed no METRICS line:\n{text[-3000:]}")
        results.append(TrainRun(seconds, epochs, sorted(peaks.values()), text))
    return results
