"""`serve`: the inference entry point, as in `docker run IMAGE serve`.

Serves the model under `<ml-root>/model` (SageMaker unpacks it into /opt/ml/model) on port
8080 or SAGEMAKER_BIND_TO_PORT; every other setting comes from the environment (see
serve.config). `serve --ml-root DIR` serves a model trained locally with `train --ml-root DIR`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from job.paths import DEFAULT_ML_ROOT
from serve.config import ServeConfig, ServeConfigError, config_from_env
from serve.server import PortInUse, run_server


def parse_args(argv: list[str] | None = None) -> ServeConfig:
    parser = argparse.ArgumentParser(prog="serve", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ml-root",
        type=Path,
        default=DEFAULT_ML_ROOT,
        help="the SageMaker directory tree; the model is read from "
        f"ML_ROOT/model (default: {DEFAULT_ML_ROOT})",
    )
    args = parser.parse_args(argv)
    try:
        return config_from_env(args.ml_root)
    except ServeConfigError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    try:
        run_server(config)
    except PortInUse as error:
        raise SystemExit(f"serve: error: {error}") from None
