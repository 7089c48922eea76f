"""Item 5: how fast the input side delivers samples, against what the trainer consumes.

- the channel reader (the source of `train.pipeline`: CSV parsed in chunks, NPZ a file at a
  time) on the same synthetic samples written as CSV and as NPZ, drained without shuffling:
  samples per second, one process, warm page cache (the files were just written), median of
  `repeats`;
- the trainer's whole tf.data pipeline (`train.pipeline.training_input`: the NPZ reader,
  shuffle, repeat, label lookup, batch, prefetch) drained batch by batch without a model: the
  rate at which it can feed a training step.

The reference is the fastest whole-job training throughput measured in the same run (items 2
and 3). One reader must outpace the whole job (every rank has its own).

Runs in its own process (TensorFlow and Horovod are imported for the tf.data part):
    python -m bench.input_pipeline OUT.json WORKDIR SAMPLES FEATURES BATCH BATCHES REPEATS
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.jobs import CLASSES, DataShape, synthetic, write_csv, write_npz

if TYPE_CHECKING:  # train.pipeline imports TensorFlow: only inside the functions that read
    from train.pipeline import Source

FORMATS = ("csv", "npz")


def channel_source(folder: Path) -> Source:
    from job.trainer_config import TrainerConfig
    from train.data import list_channel
    from train.pipeline import open_source
    from train.sharding import Share

    channel = list_channel("train", folder)
    return open_source(channel, Share(channel.files), TrainerConfig())


def drain(folder: Path) -> int:
    return sum(len(y) for _, y in channel_source(folder).samples(None).batch(4096))


def reader_rates(
    workdir: Path, samples: int, features: int, repeats: int
) -> dict[str, dict[str, Any]]:
    x, y = synthetic(DataShape(samples, features))
    writers = {"csv": write_csv, "npz": write_npz}
    rates = {}
    for name in FORMATS:
        folder = workdir / f"channel-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        path = writers[name](folder, x, y)
        drain(folder)  # warm the page cache and the code paths
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            count = drain(folder)
            timings.append(time.perf_counter() - started)
        if count != samples:
            raise RuntimeError(f"{path}: read {count} samples, wrote {samples}")
        rates[name] = {
            "samples_per_sec": [samples / t for t in timings],
            "file_bytes": path.stat().st_size,
        }
    return rates


def pipeline_rate(workdir: Path, batch: int, batches: int, repeats: int) -> dict[str, Any]:
    from job.trainer_config import TrainerConfig
    from train.pipeline import label_lookup, training_input

    source = channel_source(workdir / "channel-npz")
    dataset = training_input(
        source, label_lookup(list(range(CLASSES))), batch, TrainerConfig(), 0, augment=False
    )
    return {"samples_per_sec": iteration_rates(dataset, batch, batches, repeats), "batch": batch}


def iteration_rates(
    dataset: Iterable[object], batch: int, batches: int, repeats: int
) -> list[float]:
    """Samples/s of drawing `batches` batches from `dataset`, `repeats` times, after a first
    batch that builds the pipeline and fills its shuffle buffer."""
    iterator = iter(dataset)
    next(iterator)
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        rates.append(batches * batch / (time.perf_counter() - started))
    return rates


def main(argv: list[str]) -> None:
    out, workdir = Path(argv[0]), Path(argv[1])
    samples, features, batch, batches, repeats = map(int, argv[2:7])
    workdir.mkdir(parents=True, exist_ok=True)
    result = {
        "reader": reader_rates(workdir, samples, features, repeats),
        "pipeline": pipeline_rate(workdir, batch, batches, repeats),
    }
    for entry in [*result["reader"].values(), result["pipeline"]]:
        entry["median"] = statistics.median(entry["samples_per_sec"])
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
