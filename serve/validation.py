"""Checks that decoded instances fit the model, before they can reach a shared model call.

Each input's instances must have that input's shape (a dimension the signature leaves open
takes any size), or be a flat row of the same number of values (how CSV carries an image), and
every value must be representable in the input's dtype (finite for floats, whole for integers).
A model with several inputs gets each by name, all with the same number of instances. Checking
here, per request, keeps one bad request from failing the batch it would have shared with
others, and lets the error say which instance and which position is wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from job.signature import ModelInterface, TensorSpec
from serve.errors import BadInput


def _expected(spec: TensorSpec) -> str:
    if len(spec.shape) == 1 or not spec.fixed:
        return spec.describe()
    return f"{spec.describe()} (or a flat row of {spec.size} values)"


def _fits(shape: tuple[int, ...], spec: TensorSpec) -> bool:
    return len(shape) == len(spec.shape) and all(
        want is None or got == want for got, want in zip(shape, spec.shape)
    )


def _check_input(instances: npt.NDArray[Any], spec: TensorSpec, label: str) -> npt.NDArray[Any]:
    if instances.ndim == 0:
        raise BadInput(f"{label}expected a list of instances, got a single number")
    if len(instances) == 0:
        raise BadInput(f"{label}there are no instances to predict")
    shape = instances.shape[1:]
    if not _fits(shape, spec):
        if spec.fixed and shape == (spec.size,):
            fixed_shape = [d for d in spec.shape if d is not None]  # all of them: spec.fixed
            instances = instances.reshape((len(instances), *fixed_shape))
        else:
            raise BadInput(
                f"{label}each instance has shape {list(shape)}, but the model "
                f"expects {_expected(spec)}"
            )
    limits = np.finfo(spec.dtype) if spec.dtype.kind == "f" else np.iinfo(spec.dtype)
    representable = np.isfinite(instances) & (instances >= limits.min) & (instances <= limits.max)
    if spec.dtype.kind != "f":
        representable &= np.mod(instances, 1) == 0
    if not representable.all():
        index, *position = np.argwhere(~representable)[0].tolist()
        kind = (
            "NaN, infinite or beyond the float32 range"
            if spec.dtype == np.float32
            else f"not representable as {spec.dtype}"
        )
        raise BadInput(f"{label}instance {index} has a value at position {position} that is {kind}")
    return instances.astype(spec.dtype, copy=False)


def validate(
    inputs: npt.NDArray[Any] | dict[str, npt.NDArray[Any]], interface: ModelInterface
) -> npt.NDArray[Any]:
    """The batch for the model: one array for one input, a structured array for several."""
    names = interface.input_names
    if not isinstance(inputs, dict):
        if len(names) != 1:
            raise BadInput(
                f"the model has {len(names)} inputs ({', '.join(names)}): send "
                'named inputs, as JSON {"instances": [{"name": ...}, ...]} or '
                '{"inputs": {"name": [...], ...}}'
            )
        return _check_input(inputs, interface.inputs[0], "")
    missing = [name for name in names if name not in inputs]
    unknown = sorted(set(inputs) - set(names))
    if missing or unknown:
        raise BadInput(
            f"the model's inputs are {', '.join(names)}; "
            + "; ".join(
                part
                for part in (
                    missing and f"missing: {', '.join(missing)}",
                    unknown and f"unknown: {', '.join(unknown)}",
                )
                if part
            )
        )
    checked = {
        spec.name: _check_input(inputs[spec.name], spec, f"input {spec.name!r}: ")
        for spec in interface.inputs
    }
    if len(names) == 1:
        return checked[names[0]]
    counts = {name: len(value) for name, value in checked.items()}
    if len(set(counts.values())) > 1:
        raise BadInput(
            "every named input needs the same number of instances, got "
            + ", ".join(f"{name}: {count}" for name, count in counts.items())
        )
    if not all(spec.fixed for spec in interface.inputs):
        raise BadInput(
            "this server batches a model with several inputs only when each "
            "input's instance shape is fixed; this model's are "
            + ", ".join(f"{s.name} {s.describe()}" for s in interface.inputs)
        )
    batch = np.empty(len(next(iter(checked.values()))), interface.record_dtype())
    for name, value in checked.items():
        batch[name] = value
    return batch
