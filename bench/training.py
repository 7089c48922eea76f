"""Items 2 and 3: the real trainer's throughput (`train --ml-root`, the METRICS lines).

Item 2, scaling efficiency: samples/s of 2 ranks x 1 thread divided by twice the samples/s of
1 rank x 1 thread, same per-device batch (so twice the global batch). Item 3, gradient
accumulation cost: one rank, k accumulated micro-batches of b vs one batch of k*b (the same
optimizer step), whose whole batch is item 2's 1-rank job. Every configuration of both items
runs `repeats` times in one loop, interleaved (A B C D A B C D: TrainerJobs) so slow drift in
the machine's load hits every side; a run's throughput is the median of its epochs
after the first (the first includes tf.function tracing), and a configuration's is the median
over its runs.

TensorFlow gets one intra-op and one inter-op thread per rank through the environment
(`-x TF_NUM_INTRAOP_THREADS=1 -x TF_NUM_INTEROP_THREADS=1` in the mpi_options
hyperparameter: the operator's override the trainer documents), so 1 rank and 2 ranks differ
only in the rank count.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.jobs import CLASSES, DataShape, TrainRun, run_trains, synthetic, write_job
from bench.launch import PYTHON, run
from bench.results import Measurement, Target, median
from bench.sizes import Sizes
from container.plan import CPU_RANK_ENV

ONE_THREAD = "-x TF_NUM_INTRAOP_THREADS=1 -x TF_NUM_INTEROP_THREADS=1"
RUN_TIMEOUT = 600


def hyperparameters(
    sizes: Sizes,
    *,
    ranks: int,
    per_device_batch: int,
    max_device_batch: int,
    mpi_options: str = ONE_THREAD,
) -> dict[str, str]:
    """A throughput job: no checkpoints, no warmup, the MLP of `sizes`, fixed threads."""
    return {
        "model": "mlp",
        "hidden_units": sizes.hidden_units,
        "epochs": str(sizes.epochs),
        "processes_per_host": str(ranks),
        "per_device_batch_size": str(per_device_batch),
        "max_device_batch_size": str(max_device_batch),
        "checkpoint_every_epochs": "0",
        "warmup_epochs": "0",
        "learning_rate": "0.001",
        "mpi_options": mpi_options,
    }


@dataclass
class Configuration:
    """One way to run the trainer; `copies` independent jobs at once count as one run whose
    throughput is their sum (what the machine gives that many processes right now)."""

    name: str
    hyperparameters: dict[str, str]
    copies: int = 1
    runs: list[list[TrainRun]] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)

    def run_throughputs(self) -> list[float | None]:
        """Per run, its copies' throughputs summed; None when a copy printed no samples/s at
        all (median() then passes over that run rather than the item failing)."""
        sums: list[float | None] = []
        for group in self.runs:
            copies = [median(run.steady_samples_per_sec()) for run in group]
            measured = [rate for rate in copies if rate is not None]
            sums.append(sum(measured) if len(measured) == len(copies) else None)
        return sums

    def throughput(self) -> float | None:
        return median(self.run_throughputs())

    def rank_peaks(self) -> list[int]:
        return [peak for group in self.runs for run in group for peak in run.rank_peak_rss]

    def details(self) -> dict[str, Any]:
        return {
            "hyperparameters": self.hyperparameters,
            "copies": self.copies,
            "epoch_samples_per_sec": [
                [[e.get("samples_per_sec") for e in run.epochs] for run in group]
                for group in self.runs
            ],
            "run_seconds": [[round(run.seconds, 1) for run in group] for group in self.runs],
            "rank_peak_rss_bytes": [[run.rank_peak_rss for run in group] for group in self.runs],
            "load_average_at_start": self.loads,
        }


def run_interleaved(configurations: list[Configuration], sizes: Sizes, workdir: Path) -> None:
    data = synthetic(DataShape(sizes.samples, sizes.features))
    for repeat in range(sizes.repeats):
        for configuration in configurations:
            roots = []
            for copy in range(configuration.copies):
                root = workdir / f"{configuration.name}-{repeat}" / f"job{copy}"
                shutil.rmtree(root, ignore_errors=True)
                roots.append(write_job(root, configuration.hyperparameters, data))
            configuration.loads.append(round(os.getloadavg()[0], 2))
            configuration.runs.append(
                run_trains(
                    roots, timeout=RUN_TIMEOUT, what=f"{configuration.name} (run {repeat + 1})"
                )
            )


def kernel_ceiling(sizes: Sizes, workdir: Path) -> Measurement:
    """Item 3's diagnostic row: the model's matrix products at the micro-batch vs the whole
    batch (bench.kernels), i.e. the best ratio accumulation can reach here."""
    k = sizes.accumulation_steps
    micro, out = sizes.per_device_batch // k, workdir / "kernels.json"
    workdir.mkdir(parents=True, exist_ok=True)
    run(
        [
            PYTHON,
            "-m",
            "bench.kernels",
            str(out),
            str(micro),
            str(k),
            str(sizes.features),
            sizes.hidden_units,
            str(CLASSES),
            str(sizes.kernel_seconds),
        ],
        timeout=300,
        what="matrix products",
        env={**CPU_RANK_ENV, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    raw = json.loads(out.read_text())
    whole = sizes.per_device_batch
    return Measurement(
        item=3,
        metric=f"accumulation ceiling: matrix products {k} x {micro} vs 1 x {whole}",
        unit="samples/s",
        value=whole / (k * raw["micro_seconds"]),
        reference=whole / raw["whole_seconds"],
        reference_name=f"the same at batch {whole}",
        note="the model's Dense-layer products alone, one thread; ratio = the best item 3 "
        "can reach",
        details=raw,
    )


@dataclass
class TrainerJobs:
    """Items 2, 3 and 6's trainer runs, all in one interleaved loop (A B C D A B C D) so slow
    drift hits every side of both comparisons. Item 3's whole-batch job is item 2's 1-rank job
    (the same hyperparameters: 1 rank, the per-device batch, one thread), so it runs once for
    both items rather than once per item."""

    sizes: Sizes
    one: Configuration  # 1 rank x 1 thread: item 2's reference, item 3's whole batch
    two: Configuration | None = None  # 2 ranks x 1 thread: item 2, and item 6's rank peaks
    pair: Configuration | None = None  # 2 independent 1-rank jobs at once: item 2's diagnostic
    accumulated: Configuration | None = None  # k micro-batches, same optimizer step: item 3

    @classmethod
    def run(
        cls,
        sizes: Sizes,
        workdir: Path,
        extra_mpi_options: str = "",
        *,
        scaling: bool,
        capacity: bool,
        accumulation: bool,
    ) -> TrainerJobs:
        """The configurations the selected items need: `scaling` the 2-rank job, `capacity`
        the pair of 1-rank jobs, `accumulation` the accumulated job (the 1-rank job always)."""
        batch, k = sizes.per_device_batch, sizes.accumulation_steps
        if accumulation and batch % k:
            raise ValueError(
                f"per_device_batch {batch} must be a multiple of accumulation_steps {k}"
            )
        options = f"{ONE_THREAD} {extra_mpi_options}".strip()

        def job(ranks: int, max_device_batch: int) -> dict[str, str]:
            return hyperparameters(
                sizes,
                ranks=ranks,
                per_device_batch=batch,
                max_device_batch=max_device_batch,
                mpi_options=options,
            )

        jobs = cls(sizes, Configuration("1rank", job(1, batch)))
        if scaling:
            jobs.two = Configuration("2ranks", job(2, batch))
        if capacity:
            jobs.pair = Configuration("2jobs", jobs.one.hyperparameters, copies=2)
        if accumulation:
            jobs.accumulated = Configuration(f"accumulate{k}", job(1, batch // k))
        configurations = [jobs.one, jobs.two, jobs.pair, jobs.accumulated]
        run_interleaved([c for c in configurations if c is not None], sizes, workdir)
        return jobs

    def scaling_rows(self) -> list[Measurement]:
        """The scaling row, and with the pair a diagnostic row: two independent 1-rank jobs at
        once, i.e. what two processes get from this machine now. 2 ranks vs that isolates what
        the ranks lose to each other (communication) from what other work on the machine
        takes."""
        one, two, pair, sizes = self.one, self.two, self.pair, self.sizes
        if two is None:
            raise ValueError("the 2-rank job was not run: TrainerJobs.run(scaling=True)")
        single = one.throughput()
        model = f"mlp {sizes.features}-{sizes.hidden_units.replace(',', '-')}-10"
        rows = [
            Measurement(
                item=2,
                metric="scaling: 2 ranks x 1 thread, samples/s",
                unit="samples/s",
                value=two.throughput(),
                reference=None if single is None else 2 * single,
                reference_name="2 x 1 rank x 1 thread",
                target=Target("ratio", ">=", 0.9),
                note=f"{model}, per-device batch {sizes.per_device_batch}",
                samples=tuple(two.run_throughputs()),
                details={
                    "one_rank": one.details(),
                    "two_ranks": two.details(),
                    "one_rank_samples_per_sec": one.run_throughputs(),
                },
            )
        ]
        if pair is not None:
            rows.append(
                Measurement(
                    item=2,
                    metric="scaling diagnostic: 2 ranks vs 2 independent 1-rank jobs",
                    unit="samples/s",
                    value=two.throughput(),
                    reference=pair.throughput(),
                    reference_name="2 jobs x 1 rank, summed",
                    note="the machine's capacity now; ratio = what the ranks lose to each other",
                    samples=tuple(pair.run_throughputs()),
                    details={"pair": pair.details()},
                )
            )
        return rows

    def accumulation_rows(self, workdir: Path) -> list[Measurement]:
        """Item 3's row (the accumulated job vs the 1-rank job at the whole batch) and its
        ceiling (kernel_ceiling, run in `workdir`)."""
        accumulated, whole, sizes = self.accumulated, self.one, self.sizes
        if accumulated is None:
            raise ValueError("the accumulated job was not run: TrainerJobs.run(accumulation=True)")
        k, big = sizes.accumulation_steps, sizes.per_device_batch
        measurement = Measurement(
            item=3,
            metric=f"accumulation: {k} x {big // k} vs 1 x {big}, samples/s",
            unit="samples/s",
            value=accumulated.throughput(),
            reference=whole.throughput(),
            reference_name=f"one batch of {big}",
            target=Target("ratio", ">=", 0.9),
            samples=tuple(accumulated.run_throughputs()),
            details={
                "accumulated": accumulated.details(),
                "whole_batch": whole.details(),
                "whole_batch_samples_per_sec": whole.run_throughputs(),
            },
        )
        return [measurement, kernel_ceiling(sizes, workdir)]

    def consumption(self) -> list[float]:
        """Every measured job's samples/s (item 5's reference is the fastest)."""
        measured = [c.throughput() for c in (self.one, self.two, self.accumulated) if c is not None]
        return [rate for rate in measured if rate is not None]
