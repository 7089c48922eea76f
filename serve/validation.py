"""Checks that decoded instances fit the model, before they can reach a shared model call.

An instance must have the model's input shape, or be a flat row of the same number of values
(how CSV carries an image), and every value must be finite in float32. Checking here, per
request, keeps one bad request from failing the batch it would have shared with others, and
lets the error say which instance and which position is wrong.
"""

from __future__ import annotations

import numpy as np

from serve.errors import BadInput
from serve.metadata import ModelMetadata

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _expected(metadata: ModelMetadata) -> str:
    shape = list(metadata.input_shape)
    if len(shape) == 1:
        return f"{shape}"
    return f"{shape} (or a flat row of {metadata.input_size} values)"


def validate(instances: np.ndarray, metadata: ModelMetadata) -> np.ndarray:
    """The instances as a float32 batch of shape (n, *input_shape), or BadInput saying why not."""
    if instances.ndim == 0:
        raise BadInput("expected a list of instances, got a single number")
    if len(instances) == 0:
        raise BadInput("there are no instances to predict")
    shape = instances.shape[1:]
    if shape != metadata.input_shape and shape != (metadata.input_size,):
        raise BadInput(f"each instance has shape {list(shape)}, but the model expects "
                       f"{_expected(metadata)}")
    instances = instances.reshape((len(instances), *metadata.input_shape))
    representable = np.isfinite(instances) & (np.abs(instances) <= FLOAT32_MAX)
    if not representable.all():
        index, *position = np.argwhere(~representable)[0].tolist()
        raise BadInput(f"instance {index} has a value at position {position} that is NaN, "
                       "infinite or beyond the float32 range")
    return instances.astype(np.float32, copy=False)
