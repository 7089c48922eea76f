"""Item 5: how fast the input side delivers samples, against what the trainer consumes.

- the channel reader (`train.data.read_channel`, what every rank calls at start) on the same
  synthetic samples written as CSV and as NPZ: samples per second, one process, warm page
  cache (the files were just written), median of `repeats`;
- the trainer's tf.data pipeline (`train.trainer.training_input`: from_tensor_slices,
  shuffle, repeat, batch, prefetch) drained batch by batch without a model: the rate at which
  it can feed a training step.

The reference is the fastest whole-job training throughput measured in the same run (items 2
and 3). Every rank reads the whole channel, so one reader must outpace the whole job.

Runs in its own process (TensorFlow and Horovod are imported for the tf.data part):
    python -m scripts.bench.input_pipeline OUT.json WORKDIR SAMPLES FEATURES BATCH BATCHES REPEATS
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from scripts.bench.jobs import DataShape, synthetic, write_csv, write_npz

FORMATS = ("csv", "npz")


def reader_rates(workdir: Path, samples: int, features: int, repeats: int) -> dict:
    from train.data import read_channel

    x, y = synthetic(DataShape(samples, features))
    writers = {"csv": write_csv, "npz": write_npz}
    rates = {}
    for name in FORMATS:
        folder = workdir / f"channel-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        path = writers[name](folder, x, y)
        read_channel(folder)  # warm the page cache and numpy's code paths
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            data = read_channel(folder)
            timings.append(time.perf_counter() - started)
        if len(data) != samples:
            raise RuntimeError(f"{path}: read {len(data)} samples, wrote {samples}")
        rates[name] = {"samples_per_sec": [samples / t for t in timings],
                       "file_bytes": path.stat().st_size}
    return rates


def pipeline_rate(samples: int, features: int, batch: int, batches: int, repeats: int) -> dict:
    import numpy as np

    from train.batching import plan_batches
    from train.data import Dataset
    from train.hyperparameters import TrainerConfig
    from train.trainer import training_input

    x, y = synthetic(DataShape(samples, features))
    plan = plan_batches(world_size=1, global_batch_size=0, per_device_batch_size=batch,
                        max_device_batch_size=batch, learning_rate=0.001, base_batch_size=32,
                        scale_learning_rate=False)
    dataset = training_input(Dataset(x, y, ()), y.astype(np.int64), plan, TrainerConfig(), 0)
    iterator = iter(dataset)
    next(iterator)  # builds the pipeline and fills the shuffle buffer
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        rates.append(batches * plan.micro_batch / (time.perf_counter() - started))
    return {"samples_per_sec": rates, "batch": plan.micro_batch}


def main(argv: list[str]) -> None:
    out, workdir = Path(argv[0]), Path(argv[1])
    samples, features, batch, batches, repeats = map(int, argv[2:7])
    workdir.mkdir(parents=True, exist_ok=True)
    result = {"reader": reader_rates(workdir, samples, features, repeats),
              "pipeline": pipeline_rate(samples, features, batch, batches, repeats)}
    for entry in [*result["reader"].values(), result["pipeline"]]:
        entry["median"] = statistics.median(entry["samples_per_sec"])
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
