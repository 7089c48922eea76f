"""How long the end-of-job export takes: the portable SavedModel (train.export.export_model,
with its serving_default signature) against the reference, a Keras SavedModel saved without
traces and without a signature (what the trainer wrote before), for the built-in models.

    python -m bench.export [--repeats 5]

Each model is trained for one step first (as at the end of a job, its functions exist), then
both ways are timed alternately into fresh folders, so machine load hits both alike; the
first export of each way is reported apart (it traces for the first time in the process,
which is what a job pays once), then the median of the rest and the ratio to the reference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def reference(model: Any, folder: Path) -> None:
    model.save(str(folder / "model"), save_format="tf", include_optimizer=False, save_traces=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    from job.trainer_config import TrainerConfig
    from train.export import export_model
    from train.models import BUILDERS

    ways: dict[str, Callable[[Any, Path], object]] = {
        "reference (no signature)": reference,
        "export_model (signature, model/1)": lambda m, f: export_model(m, f, classes=range(10)),
    }
    print(f"{'model':6} {'way':36} {'first s':>8} {'median s':>9} {'ratio':>6}")
    for name, config in (
        ("mlp", TrainerConfig()),
        ("cnn", TrainerConfig(model="cnn", image_shape="8,8,1")),
    ):
        model = BUILDERS[name](config, (64,), 10, np.zeros(64, np.float32), np.ones(64, np.float32))
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(np.zeros((32, 64), np.float32), np.zeros(32, np.int64), verbose=0)
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.repeats + 1):
            for way, save in ways.items():
                with tempfile.TemporaryDirectory() as folder:
                    started = time.perf_counter()
                    save(model, Path(folder))
                    times[way].append(time.perf_counter() - started)
        base = statistics.median(times["reference (no signature)"][1:])
        for way, values in times.items():
            median = statistics.median(values[1:])
            print(f"{name:6} {way:36} {values[0]:8.3f} {median:9.3f} {median / base:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
