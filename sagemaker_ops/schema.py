"""Check a request against the SageMaker API schema that ships inside botocore, before sending.

botocore's own ParamValidator (what every client runs before a call) checks only types,
required members and minimums. The service also enforces each shape's maximum, its enum and
its pattern, and answers a ValidationException only after the request has left, perhaps after
a job has been half set up by a script. So `validate` runs ParamValidator and then those three
checks from the same model: a request that passes here can still be refused only for what the
schema does not say (account limits, whether an S3 object or an IAM role exists).

Patterns are matched whole, as the service does. A few use Java's Unicode classes (`\\p{L}`);
those of the form `[...]*` are checked by Unicode category, any other is left to the service.
"""

from __future__ import annotations

import difflib
import functools
import re
import unicodedata
from collections.abc import Callable
from typing import Any

import botocore.session
import botocore.validate
from botocore.model import Shape

from job.errors import ConfigError

SERVICE = "sagemaker"
_UNICODE_CLASS = re.compile(r"\(?\[((?:\\p\{[A-Z]\}|\\[^p]|[^\]\\])*)\]\*\)?")


@functools.cache
def _service_model() -> Any:
    return botocore.session.get_session().get_service_model(SERVICE)


@functools.cache
def input_shape(operation: str) -> Shape:
    """The input shape of a SageMaker operation, e.g. `CreateTrainingJob`."""
    return _service_model().operation_model(operation).input_shape


@functools.cache
def enum(shape_name: str) -> tuple[str, ...]:
    """The values a named enum shape allows, e.g. `TrainingInstanceType`."""
    return tuple(_service_model().shape_for(shape_name).enum)


@functools.cache
def _pattern_matcher(pattern: str) -> Callable[[str], bool] | None:
    if "\\p{" not in pattern:
        try:
            compiled = re.compile(pattern)
        except re.error:
            return None
        return lambda text: compiled.fullmatch(text) is not None
    match = _UNICODE_CLASS.fullmatch(pattern)
    if not match:
        return None
    body = match.group(1)
    categories = set(re.findall(r"\\p\{([A-Z])\}", body))
    literals = set(re.sub(r"\\(.)", r"\1", re.sub(r"\\p\{[A-Z]\}", "", body)))
    return lambda text: all(
        char in literals or unicodedata.category(char)[0] in categories for char in text
    )


def _enum_problem(path: str, value: str, allowed: list[str]) -> str:
    if len(allowed) <= 12:
        return f"{path}: {value!r} is not valid; choose one of {', '.join(allowed)}"
    close = difflib.get_close_matches(value, allowed, n=4, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return (
        f"{path}: {value!r} is not valid; {hint}({len(allowed)} values are valid, such as "
        f"{', '.join(allowed[:6])})"
    )


def _check(value: Any, shape: Shape, path: str, problems: list[str]) -> None:
    """Append what botocore's ParamValidator leaves out: maximums, enums, patterns."""
    meta, kind = shape.metadata, shape.type_name
    if kind == "structure" and isinstance(value, dict):
        for name, member in shape.members.items():
            if name in value:
                _check(value[name], member, f"{path}.{name}" if path else name, problems)
    elif kind in ("list", "map") and isinstance(value, (list, tuple, dict)):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: has {len(value)} entries; at most {meta['max']} allowed")
        if kind == "list":
            for index, item in enumerate(value):
                _check(item, shape.member, f"{path}[{index}]", problems)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check(key, shape.key, f"{path} key", problems)
                _check(item, shape.value, f"{path}.{key}", problems)
    elif kind == "string" and isinstance(value, str):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} characters; at most {meta['max']} allowed")
        if shape.enum and value not in shape.enum:
            problems.append(_enum_problem(path, value, list(shape.enum)))
        matcher = _pattern_matcher(meta["pattern"]) if "pattern" in meta else None
        if matcher and not matcher(value):
            problems.append(f"{path}: {value!r} does not match the pattern {meta['pattern']}")
    elif (
        kind in ("integer", "long", "float", "double")
        and not isinstance(value, bool)
        and isinstance(value, (int, float))
        and "max" in meta
        and value > meta["max"]
    ):
        problems.append(f"{path}: {value} is above the maximum {meta['max']}")


def problems(operation: str, params: dict[str, Any]) -> list[str]:
    """Everything the schema says is wrong with `params` for `operation`; empty when valid."""
    shape = input_shape(operation)
    report = botocore.validate.ParamValidator().validate(params, shape)
    found = (
        [line.strip() for line in report.generate_report().splitlines() if line.strip()]
        if report.has_errors()
        else []
    )
    _check(params, shape, "", found)
    return found


def validate(operation: str, params: dict[str, Any]) -> dict[str, Any]:
    """Return `params` unchanged when the schema accepts it; raise ConfigError listing all faults."""
    found = problems(operation, params)
    if found:
        raise ConfigError(
            f"the {operation} request does not fit the SageMaker API schema:\n  "
            + "\n  ".join(found)
        )
    return params
