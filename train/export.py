"""What rank 0 leaves behind: the model for the inference server, and the training history.

/opt/ml/model/model/1/       a portable TensorFlow SavedModel (no optimizer: it only predicts)
/opt/ml/model/model.keras    instead, for Keras 3 on JAX: the Keras file (serve loads it on
                             TensorFlow; the SavedModel export of a JAX model would go through
                             jax2tf)
/opt/ml/model/metadata.json  its classes and format (job.metadata.ModelMetadata)
/opt/ml/output/data/history.json and history.png   the per-epoch curves

The SavedModel carries a `serving_default` signature with one named input, `inputs` (batch
dimension None), and one output, `outputs`: TensorFlow Serving, SageMaker's TensorFlow Serving
container (which loads <name>/<version>/) and `tf.saved_model.load` in a process that never
imports Keras can all call it. It is still a Keras SavedModel, so Keras can rebuild it too.
Each file is written under a temporary name and renamed into place, so a kill never leaves a
half-written model for SageMaker to upload.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf

from job.metadata import SAVEDMODEL_PATH, ModelMetadata
from job.signature import SIGNATURE
from train.framework import ON_JAX
from train.plot import history_png

KERAS_FILE = "model.keras"
INPUT_NAME = "inputs"
OUTPUT_NAME = "outputs"


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


def serving_signature(model: tf.keras.Model) -> tf.types.experimental.ConcreteFunction:
    """`serving_default`: the model's forward pass on a batch of any size."""
    if len(model.inputs) != 1:
        raise ValueError(
            f"export() writes models with one input; this one has "
            f"{len(model.inputs)}: save it with model.save (the server reads "
            "its Keras signature)"
        )
    spec = tf.TensorSpec((None, *model.inputs[0].shape[1:]), model.inputs[0].dtype, INPUT_NAME)
    return tf.function(
        lambda inputs: {OUTPUT_NAME: model(inputs, training=False)}, input_signature=[spec]
    ).get_concrete_function()


def export_model(
    model: tf.keras.Model,
    model_dir: Path,
    *,
    classes: Sequence[Any] | None = None,
    info: dict | None = None,
) -> Path:
    """Write the SavedModel into <model_dir>/model/1 (Keras 3: <model_dir>/model.keras) and
    metadata.json next to it; `classes` are a classifier's labels in output order (None: a
    model whose outputs are served raw)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    if ON_JAX:
        final = model_dir / KERAS_FILE
        temporary = final.with_name(f".tmp-{os.getpid()}-{final.name}")
        model.save(str(temporary), include_optimizer=False)
        os.replace(temporary, final)
    else:
        final = model_dir / SAVEDMODEL_PATH
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.with_name(f".tmp-{final.name}-{os.getpid()}")
        shutil.rmtree(temporary, ignore_errors=True)
        # save_traces=False: the layers are rebuilt from their configs on load (every built-in
        # layer can be), so saving skips re-tracing every layer's call (1.3-1.8 s -> 0.2-0.3 s
        # at the end of every job); only the one serving signature is traced.
        model.save(
            str(temporary),
            save_format="tf",
            include_optimizer=False,
            save_traces=False,
            signatures={SIGNATURE: serving_signature(model)},
        )
        _replace_dir(temporary, final)
    shape = tuple(model.inputs[0].shape[1:])
    dtype = model.inputs[0].dtype
    ModelMetadata(
        model_path=final.relative_to(model_dir).as_posix(),
        input_shape=shape if None not in shape else None,
        classes=None if classes is None else tuple(classes),
        info={"input_dtype": getattr(dtype, "name", dtype), **(info or {})},
    ).write(model_dir)
    return final


def write_history(history: dict[str, list[float]], output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    _write_json(output_dir / "history.json", history)
    temporary = output_dir / ".tmp-history.png"
    temporary.write_bytes(history_png(history))
    os.replace(temporary, output_dir / "history.png")
