"""What rank 0 leaves behind: the model for the inference server, and the training history.

/opt/ml/model/model/        Keras SavedModel (no optimizer: the server only predicts)
/opt/ml/model/metadata.json input shape, classes and format, read by `serve`
/opt/ml/output/data/history.json and history.png   the per-epoch curves
Each is written under a temporary name and renamed into place, so a kill never leaves a
half-written model for SageMaker to upload.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import tensorflow as tf

MODEL_FOLDER = "model"
METADATA = "metadata.json"


def _replace_dir(temporary: Path, final: Path) -> None:
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)
        os.replace(temporary, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(temporary, final)


def _write_json(path: Path, value: dict) -> None:
    temporary = path.with_name(f".tmp-{path.name}")
    temporary.write_text(json.dumps(value, indent=2, default=float))
    os.replace(temporary, path)


def export_model(model: tf.keras.Model, model_dir: Path, metadata: dict) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    temporary = model_dir / f".tmp-{MODEL_FOLDER}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    model.save(str(temporary), save_format="tf", include_optimizer=False)
    _replace_dir(temporary, model_dir / MODEL_FOLDER)
    _write_json(model_dir / METADATA, {"format": "keras-savedmodel", "model_path": MODEL_FOLDER,
                                       **metadata})
    return model_dir / MODEL_FOLDER


def write_history(history: dict[str, list[float]], output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    _write_json(output_dir / "history.json", history)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = sorted({key.removeprefix("val_") for key in history if key != "lr"})
    figure, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.5), squeeze=False)
    for axis, metric in zip(axes[0], metrics):
        for key in (metric, f"val_{metric}"):
            if key in history:
                axis.plot(range(1, len(history[key]) + 1), history[key], marker="o", label=key)
        axis.set_xlabel("epoch")
        axis.set_title(metric)
        axis.legend()
    figure.tight_layout()
    temporary = output_dir / ".tmp-history.png"
    figure.savefig(temporary, format="png")
    plt.close(figure)
    os.replace(temporary, output_dir / "history.png")
