"""`make bench`: run the training benchmarks, print one table, write it as JSON.

    python -m bench [--tiny] [--only 1,2,3,4,5,6,7,9,10,11,12] [--results results]
                            [--workdir build/bench] [--cluster auto|containers|loopback]
                            [--image NAME] [--tf-image NAME] [--mpi-options "..."]

Items (see each module's docstring for the method):
  1 allreduce bus bandwidth, Horovod vs MPI_Allreduce vs memory copy  (bench.allreduce)
  2 scaling efficiency of the trainer, 2 ranks vs 1                   (bench.training)
  3 gradient accumulation cost, k micro-batches vs one big batch      (bench.training,
    and its ceiling: the model's matrix products at both sizes          bench.kernels)
  4 cluster startup overhead and teardown, 2 hosts                    (bench.cluster)
  5 input: channel reader and tf.data vs trainer consumption         (bench.input_pipeline)
  6 peak RSS per rank and of the serving worker                       (bench.memory)
  7 data at scale: RSS on a 4x channel, image input, TFRecord vs CSV  (bench.data_scale)
  9 stacks: MWMS on TF 2.21 vs Horovod on TF 2.15, 2 ranks and 1      (bench.stacks; both
    images, `make build build-tf`)
 10 a restart inside the job: rank killed to first step again, steps lost (bench.restart)
 11 a heterogeneous job's input: served by a data host's tf.data service vs read locally
                                                                      (bench.hetero)
 12 model axis 1, 2, 4 (Keras 3 on JAX): samples/s, bytes per device, peak RSS; the largest
    model that trains in a fixed memory, model axis 4 vs 1          (bench.model_axis; the
                                                                      TF 2.21 image)

Output: the table on stdout (progress and the exact commands on stderr), the full results
(every repeat, machine, load average, date) in RESULTS/bench-<date>.json and
RESULTS/bench-latest.json, the table as Markdown in RESULTS/bench-latest.md. `--tiny` runs
every item at a size where it costs little more than its processes' start-ups
(bench.sizes.TINY; what tests/bench checks); its files are named bench-tiny-*.
`--mpi-options` adds mpirun options to every trainer and allreduce run
(e.g. to try a fix: "-x HOROVOD_CYCLE_TIME=5"). Exit status 1 when an item failed to run
(a missed target is a result, not a failure).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from bench import (
    allreduce,
    cluster,
    data_scale,
    hetero,
    memory,
    model_axis,
    restart,
    stacks,
    training,
)
from bench.launch import PYTHON, REPO, log, run
from bench.results import Measurement, Target, markdown_table, report, text_table, write_report
from bench.sizes import FULL, TINY, Sizes
from scripts.local_cluster import DEFAULT_IMAGE, TF_IMAGE

ITEMS = (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12)
T = TypeVar("T")
NOISE_NOTE = (
    "The machine is shared: other work runs at the same time, so every number is "
    "the median of repeats and the load average at each run's start is in the JSON."
)


@dataclass(frozen=True)
class BenchConfig:
    tiny: bool
    items: tuple[int, ...]
    results: Path
    workdir: Path
    cluster_mode: str
    image: str
    mpi_options: str
    tf_image: str = TF_IMAGE

    def __post_init__(self) -> None:
        unknown = sorted(set(self.items) - set(ITEMS))
        if unknown or not self.items:
            raise ValueError(
                f"Unknown item(s): {unknown or 'none given'}. Choose between "
                f"{', '.join(map(str, ITEMS))}."
            )
        if self.cluster_mode not in ("auto", *cluster.MODES):
            raise ValueError(
                f"Unknown cluster mode: {self.cluster_mode}. Choose between "
                f"auto, {', '.join(cluster.MODES)}."
            )

    @property
    def sizes(self) -> Sizes:
        return TINY if self.tiny else FULL


def parse_arguments(argv: list[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="every item at a tiny size")
    parser.add_argument(
        "--only",
        default=",".join(map(str, ITEMS)),
        help="comma-separated items to run (default: all)",
    )
    parser.add_argument("--results", type=Path, default=REPO / "results")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--cluster", default="auto", help="auto, containers or loopback")
    parser.add_argument(
        "--image", default=DEFAULT_IMAGE, help="the image item 4 runs in containers (make build)"
    )
    parser.add_argument(
        "--tf-image",
        default=TF_IMAGE,
        help="the TensorFlow 2.21 image items 9 and 12 run (make build-tf)",
    )
    parser.add_argument("--mpi-options", default="", help="extra mpirun options")
    args = parser.parse_args(argv)
    try:
        items = tuple(int(item) for item in args.only.split(",") if item.strip())
        return BenchConfig(
            tiny=args.tiny,
            items=items,
            results=args.results,
            workdir=args.workdir.resolve(),
            cluster_mode=args.cluster,
            image=args.image,
            mpi_options=args.mpi_options,
            tf_image=args.tf_image,
        )
    except ValueError as error:
        parser.error(str(error))


def failed(item: int, what: str, error: Exception) -> Measurement:
    traceback.print_exc()
    return Measurement(
        item=item,
        metric=what,
        unit="",
        value=None,
        note=f"FAILED: {type(error).__name__}: {str(error).splitlines()[0]}"
        if str(error)
        else f"FAILED: {type(error).__name__}",
        details={"error": str(error)[-3000:]},
    )


def input_rows(config: BenchConfig, consumption: float | None) -> list[Measurement]:
    sizes = config.sizes
    out = config.workdir / "input.json"
    run(
        [
            PYTHON,
            "-m",
            "bench.input_pipeline",
            str(out),
            str(config.workdir / "input"),
            str(sizes.reader_samples),
            str(sizes.features),
            str(sizes.per_device_batch),
            str(sizes.pipeline_batches),
            str(sizes.pipeline_repeats),
        ],
        timeout=300,
        what="input pipeline",
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    raw = json.loads(out.read_text())

    def outpaces_the_trainer(metric: str, entry: dict[str, Any], note: str = "") -> Measurement:
        """Item 5's target for every stage of the input: ten times what the trainer consumes."""
        return Measurement(
            item=5,
            metric=metric,
            unit="samples/s",
            value=entry["median"],
            reference=consumption,
            reference_name="trainer consumption",
            target=Target("ratio", ">=", 10.0),
            samples=tuple(entry["samples_per_sec"]),
            note=note,
            details=entry,
        )

    readers = [
        outpaces_the_trainer(
            f"channel reader, {name.upper()} ({sizes.features} features)",
            raw["reader"][name],
            f"{raw['reader'][name]['file_bytes'] / 1e3:,.0f} kB file",
        )
        for name in ("csv", "npz")
    ]
    pipeline = raw["pipeline"]
    return [
        *readers,
        outpaces_the_trainer(f"tf.data training_input, batch {pipeline['batch']}", pipeline),
    ]


class Once(Generic[T]):
    """A step several items share (items 2, 3 and 6's trainer runs), run by the first item
    that needs it. A later item gets its result, or its error raised again: an item that
    depends on a failed step fails with it, without running it a second time."""

    def __init__(self, step: Callable[[], T]):
        self.step = step
        self.outcome: T | Exception | None = None

    def __call__(self) -> T:
        if self.outcome is None:
            try:
                self.outcome = self.step()
            except Exception as error:
                self.outcome = error
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    def result(self) -> T | None:
        """The result when the step has run and succeeded, else None (never runs it)."""
        return None if isinstance(self.outcome, Exception) else self.outcome


class Items:
    """Runs the items in dependency order; a failing item becomes a FAILED row, never a crash,
    and each item's wall time is kept for the JSON (a shared step's time counts for the item
    that ran it: items 2 and 3's trainer runs for item 2)."""

    def __init__(self, config: BenchConfig):
        self.config = config
        self.rows: list[Measurement] = []
        self.seconds: dict[int, float] = {}

    def attempt(
        self, item: int, what: str, measure: Callable[[], Measurement | list[Measurement]]
    ) -> None:
        if item not in self.config.items:
            return
        started = time.perf_counter()
        try:
            result = measure()
            self.rows += result if isinstance(result, list) else [result]
        except Exception as error:
            self.rows.append(failed(item, what, error))
        self.seconds[item] = round(self.seconds.get(item, 0) + time.perf_counter() - started, 1)


def run_items(config: BenchConfig) -> tuple[list[Measurement], dict[int, float]]:
    sizes, workdir, extra = config.sizes, config.workdir, config.mpi_options
    workdir.mkdir(parents=True, exist_ok=True)
    items = Items(config)
    trainer = Once(
        lambda: training.TrainerJobs.run(
            sizes,
            workdir / "trainer",
            extra,
            scaling=bool({2, 6} & set(config.items)),  # item 6 measures item 2's ranks
            capacity=2 in config.items,
            accumulation=3 in config.items,
        )
    )

    def input_pipeline() -> list[Measurement]:
        jobs = trainer.result()  # items 2 and 3's, when they ran
        known = jobs.consumption() if jobs else []
        return input_rows(config, max(known) if known else None)

    def peak_rss() -> list[Measurement]:
        two = trainer().two
        return memory.measure(
            two.rank_peaks() if two else [],
            workdir / "trainer" / "1rank-0" / "job0",  # its exported model
            sizes.features,
            sizes.serve_requests,
        )

    items.attempt(
        1,
        "allreduce busbw",
        lambda: allreduce.measure(
            sizes.allreduce_bytes, sizes.allreduce_repeats, workdir / "allreduce", extra
        ),
    )
    items.attempt(2, "scaling efficiency", lambda: trainer().scaling_rows())
    items.attempt(
        3, "accumulation cost", lambda: trainer().accumulation_rows(workdir / "accumulation")
    )
    items.attempt(5, "input pipeline", input_pipeline)
    items.attempt(6, "peak RSS", peak_rss)
    items.attempt(7, "data at scale", lambda: data_scale.measure(sizes, workdir / "data"))
    items.attempt(
        4,
        "cluster overhead",
        lambda: cluster.measure(
            sizes, workdir / "cluster", mode=config.cluster_mode, image=config.image
        ),
    )
    items.attempt(10, "restart", lambda: restart.measure(sizes, workdir / "restart"))
    items.attempt(11, "served input", lambda: hetero.measure(sizes, workdir / "hetero"))
    items.attempt(
        9,
        "stacks",
        lambda: stacks.measure(
            sizes, workdir / "stacks", horovod_image=config.image, tf_image=config.tf_image
        ),
    )
    items.attempt(
        12,
        "model axis",
        lambda: model_axis.measure(
            sizes,
            model_axis.CAPACITY_TINY if config.tiny else model_axis.CAPACITY_FULL,
            workdir / "model_axis",
            image=config.tf_image,
        ),
    )
    return sorted(items.rows, key=lambda m: m.item), items.seconds


def main(argv: list[str] | None = None) -> int:
    config = parse_arguments(argv)
    started = time.time()
    log(
        f"{'tiny' if config.tiny else 'full'} run of items "
        f"{', '.join(map(str, config.items))}; work in {config.workdir}"
    )
    rows, seconds = run_items(config)
    notes = [NOISE_NOTE] + (
        [f"extra mpirun options: {config.mpi_options}"] if config.mpi_options else []
    )
    data = report(rows, tiny=config.tiny, started=started, notes=notes)
    data["item_seconds"] = seconds
    path = write_report(data, config.results)
    (config.results / f"bench{'-tiny' if config.tiny else ''}-latest.md").write_text(
        markdown_table(rows) + "\n"
    )
    print(text_table(rows))
    for row in rows:
        if row.note:
            print(f"  [{row.item}] {row.metric}: {row.note}")
    print(
        f"{NOISE_NOTE}\nbench: {len(rows)} rows in {data['seconds']:.0f} s; written to {path}",
        flush=True,
    )
    return 1 if any(row.note.startswith("FAILED") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
