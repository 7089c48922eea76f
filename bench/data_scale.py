"""Item 7: data at scale, on the embedded digits written as TFRecord shards and CSV.

- memory: the peak RSS (VmHWM) of the ranks of a 2-rank job whose TFRecord training channel
  is `scale_copies` copies of the digits (each record also carries a PNG of
  `scale_image_size` pixels, so the channel is large: 0.27 GB in the full run), against the
  same job on 4x as many copies: the streamed pipeline holds a shuffle buffer and a few
  batches, never the channel (target: at most 1.2x);
- image input: the trainer's whole tf.data pipeline for an image model (TFRecord PNGs decoded,
  resized, flipped and cropped, shuffled, batched) drained alone in one process, against what a
  2-rank job of `image_model` on the same channel (`image_copies` copies) consumes (samples/s
  over all ranks in its second epoch; the first traces the model) (target: at least 2x);
- accuracy: the validation accuracy of a 2-rank job on 4 TFRecord shards (each rank reads its
  own 2 files) against the same job on one CSV file (records split), same seed, same data
  (target: within 1 point, i.e. a ratio of at least 0.99 at these accuracies).
The two jobs of the memory comparison run at the same time, and so do the two of the
accuracy one: neither measures time, and a rank's peak RSS and a seeded job's accuracy do not
depend on what else runs, so each pair costs one job's wall time rather than two.

The pipeline part runs in its own process:
    python -m bench.data_scale pipeline OUT.json CHANNEL BATCH BATCHES REPEATS
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

from bench.input_pipeline import iteration_rates
from bench.jobs import TrainRun, run_trains
from bench.launch import PYTHON, run
from bench.results import Measurement, Target, median
from bench.sizes import Sizes
from job.paths import MlPaths
from job.sagemaker_config import JobConfig, ResourceConfig, write_job_config
from scripts.default_job import digits_channels
from scripts.digits_files import write_digits

MB = 1024 * 1024
RUN_TIMEOUT = 900
QUIET = {"checkpoint_every_epochs": "0", "processes_per_host": "2", "seed": "7"}


def job(
    root: Path, kind: str, hyperparameters: dict[str, str], copies: int = 1, size: int = 32
) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    paths = MlPaths(root)
    write_job_config(
        JobConfig(
            paths,
            ResourceConfig("algo-1", ("algo-1",), "lo"),
            {**QUIET, **hyperparameters},
            digits_channels(kind),
        )
    )
    write_digits(paths.data_dir, kind, copies=copies, size=size)
    return root


def train(root: Path, what: str) -> TrainRun:
    return run_trains([root], timeout=RUN_TIMEOUT, what=what)[0]


def channel_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "input" / "data" / "train").iterdir())


def memory(sizes: Sizes, workdir: Path) -> Measurement:
    mlp = {
        "epochs": "1",
        "feature_key": "features",
        "learning_rate": "0.002",
        "per_device_batch_size": "256",
    }
    small = job(workdir / "memory-1x", "tfrecord", mlp, sizes.scale_copies, sizes.scale_image_size)
    large = job(
        workdir / "memory-4x", "tfrecord", mlp, 4 * sizes.scale_copies, sizes.scale_image_size
    )
    one, four = run_trains([small, large], timeout=RUN_TIMEOUT, what="data scale 1x and 4x")
    peaks = {"1x": max(one.rank_peak_rss), "4x": max(four.rank_peak_rss)}
    sizes_mb = {name: channel_bytes(root) / MB for name, root in (("1x", small), ("4x", large))}
    return Measurement(
        item=7,
        metric="peak RSS per rank, TFRecord channel 4x larger",
        unit="MB",
        value=peaks["4x"] / MB,
        reference=peaks["1x"] / MB,
        reference_name=f"the same job on a {sizes_mb['1x']:.0f} MB channel",
        target=Target("ratio", "<=", 1.2),
        note=f"channels {sizes_mb['1x']:.0f} MB and {sizes_mb['4x']:.0f} MB of TFRecords",
        details={"peak_rss_bytes": peaks, "channel_mb": sizes_mb},
    )


def image_input(sizes: Sizes, workdir: Path) -> Measurement:
    hyperparameters = {
        "epochs": "2",
        "model": sizes.image_model,  # the first one traces
        "augment": "true",
        "per_device_batch_size": "32",
    }
    root = job(workdir / "image", "tfrecord", hyperparameters, sizes.image_copies)
    consumed = median(train(root, f"data scale {sizes.image_model}").steady_samples_per_sec())
    out = workdir / "image-pipeline.json"
    run(
        [
            PYTHON,
            "-m",
            "bench.data_scale",
            "pipeline",
            str(out),
            str(root / "input" / "data" / "train"),
            "32",
            str(sizes.pipeline_batches),
            str(sizes.pipeline_repeats),
        ],
        timeout=600,
        what="image input pipeline",
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    rates = json.loads(out.read_text())["samples_per_sec"]
    return Measurement(
        item=7,
        metric="image input pipeline alone (TFRecord PNG 32x32, augmented)",
        unit="samples/s",
        value=statistics.median(rates),
        reference=consumed,
        reference_name=f"2-rank {sizes.image_model} job consumption",
        target=Target("ratio", ">=", 2.0),
        samples=tuple(rates),
        details={"pipeline_samples_per_sec": rates, "job_samples_per_sec": consumed},
    )


def accuracy(sizes: Sizes, workdir: Path) -> Measurement:
    mlp = {"epochs": str(sizes.parity_epochs), "learning_rate": "0.002"}
    tfrecord, csv = run_trains(
        [
            job(workdir / "parity-tfrecord", "tfrecord", {**mlp, "feature_key": "features"}),
            job(workdir / "parity-csv", "csv", mlp),
        ],
        timeout=RUN_TIMEOUT,
        what="parity on TFRecord and on CSV",
    )
    value, reference = (100 * run_.epochs[-1]["val_accuracy"] for run_ in (tfrecord, csv))
    return Measurement(
        item=7,
        metric="validation accuracy, 2 ranks on 4 TFRecord shards (by file)",
        unit="%",
        value=value,
        reference=reference,
        reference_name="the same job on one CSV file (by record)",
        target=Target("ratio", ">=", 0.99),
        note=f"difference {value - reference:+.1f} points",
        details={"epochs": sizes.parity_epochs},
    )


def measure(sizes: Sizes, workdir: Path) -> list[Measurement]:
    workdir.mkdir(parents=True, exist_ok=True)
    return [memory(sizes, workdir), image_input(sizes, workdir), accuracy(sizes, workdir)]


def pipeline_rates(
    channel: Path, batch: int, batches: int, repeats: int, service: str = ""
) -> list[float]:
    """The trainer's augmented pipeline on `channel`, drained here, or read through the
    tf.data service at `service` (item 11)."""
    from job.trainer_config import TrainerConfig
    from train.data import list_channel
    from train.pipeline import label_lookup, open_source, served, training_input
    from train.sharding import Share

    files = list_channel("train", channel)
    config = TrainerConfig(augment=True)
    source = open_source(files, Share(files.files), config)
    dataset = training_input(source, label_lookup(list(range(10))), batch, config, 0, augment=True)
    return iteration_rates(
        served(dataset, service) if service else dataset, batch, batches, repeats
    )


def main(argv: list[str]) -> None:
    if argv[0] != "pipeline":
        raise SystemExit(__doc__)
    out, channel = Path(argv[1]), Path(argv[2])
    batch, batches, repeats = map(int, argv[3:6])
    out.write_text(
        json.dumps({"samples_per_sec": pipeline_rates(channel, batch, batches, repeats)})
    )


if __name__ == "__main__":
    main(sys.argv[1:])
