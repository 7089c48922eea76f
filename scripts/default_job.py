"""The main job of `make train`: a real 2-process distributed run on an embedded dataset.

Writes scikit-learn's bundled digits (1797 8x8 images, no network needed) as CSV channel
files (label first, no header) into a SageMaker tree, with the config SageMaker would write,
then runs the real launcher on it (`train --ml-root ...`): mpirun, 2 Horovod ranks, the
built-in trainer. Ends with the accuracy and where the model was written.

    python scripts/default_job.py [--ml-root build/default-job] [--epochs 8] [--processes 2]
                                  [--model mlp|cnn] [--no-run] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

from container.paths import MlPaths
from container.sagemaker_config import Channel, JobConfig, ResourceConfig, write_job_config
from serve.metadata import ModelMetadata

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "build" / "default-job"
DIGITS_CHANNELS = {name: Channel(name, "text/csv") for name in ("train", "validation")}


def write_digits(data_dir: Path, validation_fraction: float = 0.2, seed: int = 0) -> None:
    """Digits as train/digits.csv and validation/digits.csv (label, 64 pixel values)."""
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    table = np.column_stack([digits.target, digits.data])[order]
    cut = int(len(table) * (1 - validation_fraction))
    for channel, rows in zip(DIGITS_CHANNELS, (table[:cut], table[cut:])):
        folder = data_dir / channel
        folder.mkdir(parents=True, exist_ok=True)
        np.savetxt(folder / "digits.csv", rows, delimiter=",", fmt="%g")


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ml-root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--no-run", action="store_true", help="only write the job tree")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra hyperparameter (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    hyperparameters = {"epochs": args.epochs, "processes_per_host": args.processes,
                       "model": args.model, "learning_rate": 0.002, "warmup_epochs": 1}
    if args.model == "cnn":
        hyperparameters["image_shape"] = "8,8,1"
    for item in args.set:
        key, separator, value = item.partition("=")
        if not separator:
            sys.exit(f"--set {item!r}: expected KEY=VALUE")
        hyperparameters[key] = value
    shutil.rmtree(args.ml_root, ignore_errors=True)
    paths = MlPaths(args.ml_root)
    write_job_config(JobConfig(paths, ResourceConfig("algo-1", ("algo-1",), "lo"),
                               hyperparameters, DIGITS_CHANNELS))
    write_digits(paths.data_dir)
    print(f"default job: digits written under {args.ml_root}", flush=True)
    if args.no_run:
        return 0
    train = Path(sys.executable).with_name("train")
    code = subprocess.call([str(train), "--ml-root", str(args.ml_root)])
    metadata = ModelMetadata.read(args.ml_root / "model")
    if code == 0 and metadata is not None:
        metrics = metadata.info["final_metrics"]
        print(f"default job: validation accuracy {metrics.get('val_accuracy', float('nan')):.4f}"
              f", model written to {args.ml_root / 'model'}")
    else:
        failure = args.ml_root / "output" / "failure"
        print(f"default job: FAILED: {failure.read_text() if failure.exists() else code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
