"""The model directory's metadata.json: the one definition of its names and format, written by
the exporter (train.export) and read by the server.

    {"format": "keras-savedmodel", "model_path": "model/1", "input_shape": [64],
     "input_dtype": "float32", "task": "classification", "classes": [0, 1, ..., 9],
     "output": "probabilities", "final_metrics": {...}, "tensorflow": "2.15.1"}

`model_path` is the SavedModel folder relative to the model directory (the exporter writes a
TensorFlow Serving version folder, model/1; older exports wrote model). `input_shape` is one
instance's shape, without the batch dimension: the server takes shapes and dtypes from the
SavedModel's signature, so it is informational there, like `input_dtype`. `classes` are a
classifier's labels in the order of the model's output columns; a model whose task is not
classification has none and its outputs are returned as they are. Other keys are
informational (`info`): written, never read by the server. The file is optional: without it the server finds the SavedModel by its
layout (serve.model). Every problem is a `ModelLoadError` that names the key and what it
should hold.

This module imports neither TensorFlow nor Flask: the trainer and the server both use it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "keras-savedmodel"
METADATA_FILE = "metadata.json"
SAVEDMODEL_PATH = "model/1"  # TensorFlow Serving's <name>/<version> layout
_KNOWN = {"format", "model_path", "input_shape", "task", "classes", "output"}


class ModelLoadError(Exception):
    """The model directory cannot be served; the message says what is missing or wrong."""


@dataclass(frozen=True)
class ModelMetadata:
    """What metadata.json says about the model next to it."""

    model_path: str = SAVEDMODEL_PATH
    input_shape: tuple[int, ...] | None = None
    classes: tuple[Any, ...] | None = (
        None  # None: not a classifier, outputs are returned as they are
    )
    info: dict[str, Any] = field(default_factory=dict)  # informational keys, e.g. final_metrics

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"format": FORMAT, "model_path": self.model_path}
        if self.input_shape is not None:
            document["input_shape"] = list(self.input_shape)
        if self.classes is None:
            document["task"] = "regression"
        else:
            document.update(
                task="classification", classes=list(self.classes), output="probabilities"
            )
        return {**document, **{k: v for k, v in self.info.items() if k not in _KNOWN}}

    def write(self, model_dir: Path) -> Path:
        """Write `<model_dir>/metadata.json` under a temporary name, then rename it in place."""
        path = model_dir / METADATA_FILE
        temporary = path.with_name(f".tmp-{METADATA_FILE}-{os.getpid()}")
        temporary.write_text(json.dumps(self.to_json(), indent=2, default=float))
        os.replace(temporary, path)
        return path

    @classmethod
    def read(cls, model_dir: Path) -> ModelMetadata | None:
        """Read and check `<model_dir>/metadata.json`; None when there is none."""
        path = model_dir / METADATA_FILE
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ModelLoadError(f"{path} cannot be read as JSON: {error}") from None
        if not isinstance(document, dict):
            raise ModelLoadError(f"{path} must hold a JSON object, got {type(document).__name__}")
        if document.get("format", FORMAT) != FORMAT:
            raise ModelLoadError(
                f"{METADATA_FILE}: format {document.get('format')!r} is not "
                f"supported; expected {FORMAT!r}"
            )
        model_path = document.get("model_path", "model")
        if not isinstance(model_path, str) or not model_path:
            raise ModelLoadError(
                f"{METADATA_FILE}: model_path must be a path relative to "
                f"{model_dir}, got {model_path!r}"
            )
        shape = document.get("input_shape")
        return cls(
            model_path=model_path,
            input_shape=None if shape is None else _shape(shape),
            classes=_classes(document),
            info={k: v for k, v in document.items() if k not in _KNOWN},
        )


def _shape(value: Any) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value)
    ):
        raise ModelLoadError(
            f"{METADATA_FILE}: input_shape must be a non-empty list of "
            f"positive integers (one instance, no batch dimension), got {value!r}"
        )
    return tuple(value)


def _classes(document: dict[str, Any]) -> tuple[Any, ...] | None:
    if document.get("task", "classification") != "classification":
        return None
    classes = document.get("classes")
    if not isinstance(classes, list) or not classes:
        raise ModelLoadError(
            f'{METADATA_FILE}: a classification model needs "classes", the '
            f"non-empty list of labels in output order, got {classes!r}"
        )
    output = document.get("output", "probabilities")
    if output != "probabilities":
        raise ModelLoadError(
            f"{METADATA_FILE}: output {output!r} is not supported for a "
            'classifier; expected "probabilities"'
        )
    return tuple(classes)
