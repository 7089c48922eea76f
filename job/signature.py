"""The served model's interface: its named inputs (shape of one instance, dtype), its named
outputs and, for a classifier, its class labels. Taken from the SavedModel's serving_default
signature (or the Keras model's inputs) when the model loads; requests are checked against it.

A batch for a model with one input is one array (first axis = instances). For several inputs
it is one structured array, a record per instance with a field per input, so the micro-batcher
can concatenate and slice it like any other array; outputs of a model with several outputs
travel the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

SUPPORTED_KINDS = "iuf"  # integers and floats: what JSON, CSV and .npy requests carry
SIGNATURE = "serving_default"  # the signature served, TensorFlow Serving's default


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int | None, ...]  # one instance, without the batch dimension; None = any size
    dtype: np.dtype[Any]

    @property
    def fixed(self) -> bool:
        return all(d is not None for d in self.shape)

    @property
    def size(self) -> int | None:
        """Values in one instance (the length of a flat CSV row), when every dimension is known."""
        return math.prod(d for d in self.shape if d is not None) if self.fixed else None

    def describe(self) -> str:
        return "[" + ", ".join("None" if d is None else str(d) for d in self.shape) + "]"


@dataclass(frozen=True)
class ModelInterface:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]
    classes: tuple[Any, ...] | None = None

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def record_dtype(self) -> np.dtype[Any]:
        """The structured dtype of one instance of a model with several (fixed-shape) inputs."""
        return np.dtype([(spec.name, spec.dtype, spec.shape) for spec in self.inputs])

    def feed(self, batch: npt.NDArray[Any]) -> dict[str, npt.NDArray[Any]]:
        """A batch as the model's named inputs."""
        if len(self.inputs) == 1:
            return {self.inputs[0].name: batch}
        return {name: np.ascontiguousarray(batch[name]) for name in self.input_names}

    def describe(self) -> str:
        inputs = ", ".join(f"{s.name} {s.describe()} {s.dtype}" for s in self.inputs)
        answer = f"{len(self.classes)} classes" if self.classes else "raw outputs"
        return f"inputs {inputs}; outputs {', '.join(self.outputs)}; {answer}"


def pack_outputs(outputs: dict[str, npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """The model's outputs as one array: itself for one output, else a structured array."""
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    dtype = np.dtype([(name, value.dtype, value.shape[1:]) for name, value in outputs.items()])
    packed = np.empty(len(next(iter(outputs.values()))), dtype)
    for name, value in outputs.items():
        packed[name] = value
    return packed
