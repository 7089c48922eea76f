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
import json
import shutil
import subprocess
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file, too
from scripts.digits_files import KINDS, write_digits  # noqa: E402

CONTENT_TYPES = {"csv": "text/csv", "tfrecord": "application/x-tfrecord",
                 "images": "application/x-image"}
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "build" / "default-job"


def write_job(root: Path, hyperparameters: dict[str, str], hosts: list[str],
              current_host: str, kind: str = "csv") -> None:
    """A fresh SageMaker tree for one host: config files and the channel data."""
    config = root / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "resourceconfig.json").write_text(json.dumps({
        "current_host": current_host, "hosts": hosts, "network_interface_name": "lo"}))
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "inputdataconfig.json").write_text(json.dumps({
        name: {"ContentType": CONTENT_TYPES[kind], "TrainingInputMode": "File",
               "S3DistributionType": "FullyReplicated"} for name in ("train", "validation")}))
    write_digits(root / "input" / "data", kind)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ml-root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--model", choices=("mlp", "cnn", "resnet50", "mobilenet_v2"),
                        default="mlp")
    parser.add_argument("--data", choices=KINDS, default="csv",
                        help="the kind of channel files (tfrecord and images: 32x32 PNGs)")
    parser.add_argument("--no-run", action="store_true", help="only write the job tree")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra hyperparameter (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    hyperparameters = {"epochs": str(args.epochs), "processes_per_host": str(args.processes),
                       "model": args.model, "learning_rate": "0.002", "warmup_epochs": "1"}
    if args.model == "cnn":
        hyperparameters["image_shape"] = "8,8,1"
    for item in args.set:
        key, separator, value = item.partition("=")
        if not separator:
            sys.exit(f"--set {item!r}: expected KEY=VALUE")
        hyperparameters[key] = value
    shutil.rmtree(args.ml_root, ignore_errors=True)
    write_job(args.ml_root, hyperparameters, ["algo-1"], "algo-1", args.data)
    print(f"default job: digits written as {args.data} under {args.ml_root}", flush=True)
    if args.no_run:
        return 0
    train = Path(sys.executable).with_name("train")
    code = subprocess.call([str(train), "--ml-root", str(args.ml_root)])
    metadata = args.ml_root / "model" / "metadata.json"
    if code == 0 and metadata.exists():
        metrics = json.loads(metadata.read_text())["final_metrics"]
        print(f"default job: validation accuracy {metrics.get('val_accuracy', float('nan')):.4f}"
              f", model written to {args.ml_root / 'model'}")
    else:
        failure = args.ml_root / "output" / "failure"
        print(f"default job: FAILED: {failure.read_text() if failure.exists() else code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
