"""The model directory's metadata.json: what the server must know before it loads any weights.

The trainer writes it next to the SavedModel, e.g.
`{"format": "keras-savedmodel", "model_path": "model", "input_shape": [64],
  "input_dtype": "float32", "task": "classification", "classes": [0, 1, ..., 9],
  "output": "probabilities"}`. `input_shape` is one instance's shape, without the batch
dimension; `classes` are the labels in the order of the model's output columns. Keys the
server does not use are ignored, so the trainer may add informational ones. Every problem is
reported as a `ModelLoadError` that names the key and what it should hold.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve.errors import ModelLoadError

FORMAT = "keras-savedmodel"
METADATA_FILE = "metadata.json"


@dataclass(frozen=True)
class ModelMetadata:
    """The served model's interface: where it is, what one instance looks like, what it says."""

    model_path: Path
    input_shape: tuple[int, ...]
    classes: tuple[Any, ...] | None  # None: not a classifier, outputs are returned as they are

    @property
    def input_size(self) -> int:
        """Values in one instance: the length of a flat CSV row."""
        return math.prod(self.input_shape)


def _input_shape(value: Any) -> tuple[int, ...]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value)):
        raise ModelLoadError(f"{METADATA_FILE}: input_shape must be a non-empty list of "
                             f"positive integers (one instance, no batch dimension), got {value!r}")
    return tuple(value)


def _classes(document: dict) -> tuple[Any, ...] | None:
    task = document.get("task", "classification")
    if task != "classification":
        return None
    classes = document.get("classes")
    if not isinstance(classes, list) or not classes:
        raise ModelLoadError(f"{METADATA_FILE}: a classification model needs \"classes\", the "
                             f"non-empty list of labels in output order, got {classes!r}")
    output = document.get("output", "probabilities")
    if output != "probabilities":
        raise ModelLoadError(f"{METADATA_FILE}: output {output!r} is not supported for a "
                             "classifier; expected \"probabilities\"")
    return tuple(classes)


def read_metadata(model_dir: Path) -> ModelMetadata:
    """Read and check `<model_dir>/metadata.json`."""
    path = model_dir / METADATA_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(
            f"no model to serve: {path} does not exist. The server serves what the trainer "
            f"exported into {model_dir} (metadata.json and the SavedModel it names)") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ModelLoadError(f"{path} cannot be read as JSON: {error}") from None
    if not isinstance(document, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(document).__name__}")
    if document.get("format") != FORMAT:
        raise ModelLoadError(f"{METADATA_FILE}: format {document.get('format')!r} is not "
                             f"supported; expected {FORMAT!r}")
    if document.get("input_dtype", "float32") != "float32":
        raise ModelLoadError(f"{METADATA_FILE}: input_dtype {document['input_dtype']!r} is not "
                             "supported; expected \"float32\"")
    model_path = document.get("model_path", "model")
    if not isinstance(model_path, str) or not model_path:
        raise ModelLoadError(f"{METADATA_FILE}: model_path must be a path relative to "
                             f"{model_dir}, got {model_path!r}")
    return ModelMetadata(model_path=model_dir / model_path,
                         input_shape=_input_shape(document.get("input_shape")),
                         classes=_classes(document))
