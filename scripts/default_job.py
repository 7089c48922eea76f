"""The main job of `make train`: a real 2-process distributed run on an embedded dataset.

Writes scikit-learn's bundled digits (1797 8x8 images, no network needed) as CSV channel
files (label first, no header; or TFRecord shards or an image folder with --data, see
scripts/digits_files.py) into a SageMaker tree, with the config SageMaker would write,
then runs the real launcher on it (`train --ml-root ...`): mpirun, 2 Horovod ranks, the
built-in trainer. Ends with the accuracy and where the model was written.

    python scripts/default_job.py [--ml-root build/default-job] [--epochs 8] [--processes 2]
                                  [--model mlp|cnn|resnet50|mobilenet_v2]
                                  [--data csv|tfrecord|images] [--no-run] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from job.metadata import ModelMetadata
from job.paths import MlPaths
from job.sagemaker_config import Channel, JobConfig, ResourceConfig, write_job_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file, too
from scripts.digits_files import KINDS, write_digits  # noqa: E402

CONTENT_TYPES = {
    "csv": "text/csv",
    "tfrecord": "application/x-tfrecord",
    "images": "application/x-image",
}
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "build" / "default-job"


def digits_channels(kind: str = "csv") -> dict[str, Channel]:
    """The job's train and validation channels, declared with the content type of `kind`."""
    return {name: Channel(name, CONTENT_TYPES[kind]) for name in ("train", "validation")}


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ml-root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument(
        "--model", choices=("mlp", "cnn", "resnet50", "mobilenet_v2"), default="mlp"
    )
    parser.add_argument(
        "--data",
        choices=KINDS,
        default="csv",
        help="the kind of channel files (tfrecord and images: 32x32 PNGs)",
    )
    parser.add_argument("--no-run", action="store_true", help="only write the job tree")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra hyperparameter (repeatable)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    hyperparameters = {
        "epochs": args.epochs,
        "processes_per_host": args.processes,
        "model": args.model,
        "learning_rate": 0.002,
        "warmup_epochs": 1,
    }
    if args.model == "cnn":
        hyperparameters["image_shape"] = "8,8,1"
    for item in args.set:
        key, separator, value = item.partition("=")
        if not separator:
            sys.exit(f"--set {item!r}: expected KEY=VALUE")
        hyperparameters[key] = value
    shutil.rmtree(args.ml_root, ignore_errors=True)
    paths = MlPaths(args.ml_root)
    write_job_config(
        JobConfig(
            paths,
            ResourceConfig("algo-1", ("algo-1",), "lo"),
            hyperparameters,
            digits_channels(args.data),
        )
    )
    write_digits(paths.data_dir, args.data)
    print(f"default job: digits written as {args.data} under {args.ml_root}", flush=True)
    if args.no_run:
        return 0
    train = Path(sys.executable).with_name("train")
    code = subprocess.call([str(train), "--ml-root", str(args.ml_root)])
    metadata = ModelMetadata.read(args.ml_root / "model")
    if code == 0 and metadata is not None:
        metrics = metadata.info["final_metrics"]
        print(
            f"default job: validation accuracy {metrics.get('val_accuracy', float('nan')):.4f}"
            f", model written to {args.ml_root / 'model'}"
        )
    else:
        failure = args.ml_root / "output" / "failure"
        print(f"default job: FAILED: {failure.read_text() if failure.exists() else code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
