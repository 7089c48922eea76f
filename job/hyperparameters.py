"""Typed hyperparameters from SageMaker's string map.

SageMaker hands every hyperparameter over as a string in hyperparameters.json, and the value's
form depends on who made the job: framework estimators json.dumps values, a plain Estimator
only str()s them. So `0.1`, `"0.1"`, `true`, `"True"` and `"\"adam\""` all occur. Each value is
decoded as JSON when it is valid JSON and taken raw otherwise, then coerced to the type that
the config dataclass declares for it, with the declared range or choices checked. This
project's own tools write values with `encode`, the one encoder (see there).

A config is a frozen dataclass whose fields are declared with `hp(...)`: the field's type, default,
range and help text are the single definition of that hyperparameter. The launcher validates
with it, every rank parses with it, and the SageMaker algorithm specification is generated from
it (`describe`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from job.errors import ConfigError

T = TypeVar("T")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def hp(
    default: Any,
    help: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """Declare a hyperparameter field: its default, meaning, allowed values and other names."""
    return dataclasses.field(
        default=default,
        metadata={
            "help": help,
            "minimum": minimum,
            "maximum": maximum,
            "choices": choices,
            "aliases": aliases,
        },
    )


def encode(value: Any) -> str:
    """A value as hyperparameters.json carries it: a string as it is, anything else as JSON.

    A string goes as a plain Estimator, the console and CreateAlgorithm's ranges spell it
    (`adam`, not the framework estimators' `"adam"`); anything else as a framework estimator
    sends it (`true`, `0.1`, `[1, 2]`), because Python's str() writes `True` or `{'a': 1}`,
    which is not JSON. `decode` reads every such value back.
    """
    return value if isinstance(value, str) else json.dumps(value)


def decode(raw: Any) -> Any:
    """A value as JSON when it is valid JSON, else the raw string (SageMaker sends both)."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: JSON nested past the parser's depth
        return raw


def unpassable(value: Any) -> str:
    """What keeps `value` (text, or decoded JSON: its keys and texts at any depth) from
    reaching a program as arguments, environment values or paths, "" when nothing does: exec
    takes NUL-terminated bytes, and a lone surrogate (JSON's "\\ud800") has no UTF-8."""
    pending = [value]
    while pending:  # a loop, not recursion: JSON nests up to the interpreter's limit
        item = pending.pop()
        if isinstance(item, dict):
            pending += [*item, *item.values()]
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, str):
            if "\x00" in item:
                return "a NUL character"
            try:
                item.encode()
            except UnicodeEncodeError:
                return "a lone surrogate (text with no UTF-8)"
    return ""


def _allowed(field: dataclasses.Field[Any], kind: type) -> str:
    meta = field.metadata
    if meta["choices"]:
        return "one of " + ", ".join(meta["choices"])
    if kind is bool:
        return "true or false"
    bounds = [
        f">= {meta['minimum']}" if meta["minimum"] is not None else "",
        f"<= {meta['maximum']}" if meta["maximum"] is not None else "",
    ]
    text = " and ".join(b for b in bounds if b)
    return f"{'an integer' if kind is int else 'a number' if kind is float else 'a string'}" + (
        f" {text}" if text else ""
    )


def coerce(field: dataclasses.Field[Any], kind: type, raw: Any) -> Any:
    """Turn one raw hyperparameter value into the field's type, or raise ConfigError."""
    value = decode(raw)
    problem = f"hyperparameter {field.name}={raw!r} is invalid: expected {_allowed(field, kind)}"
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ConfigError(problem)
    if kind is str:
        value = value if isinstance(value, str) else str(raw)
        if field.metadata["choices"] and value not in field.metadata["choices"]:
            raise ConfigError(problem)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(problem)
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ConfigError(problem)
        value = int(value)
    else:
        try:
            value = float(value)
        except OverflowError:  # an integer past any float
            raise ConfigError(problem) from None
        if not math.isfinite(value):
            raise ConfigError(problem)
    meta = field.metadata
    if (meta["minimum"] is not None and value < meta["minimum"]) or (
        meta["maximum"] is not None and value > meta["maximum"]
    ):
        raise ConfigError(problem)
    return value


def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], type]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def names(cls: type) -> set[str]:
    """Every name a config accepts, aliases included."""
    return {n for f, _ in _fields(cls) for n in (f.name, *f.metadata["aliases"])}


def parse(
    cls: type[T], raw: Mapping[str, Any], *, allow_unknown: bool = False
) -> tuple[T, dict[str, Any]]:
    """Build `cls` from a raw hyperparameter map; return it and the keys it did not know.

    Unknown keys are an error unless `allow_unknown`; the message lists the valid names.
    A value given under two names (a field and its alias) must agree.
    """
    values: dict[str, Any] = {}
    known: set[str] = set()
    for field, kind in _fields(cls):
        for name in (field.name, *field.metadata["aliases"]):
            if name in raw:
                known.add(name)
                value = coerce(field, kind, raw[name])
                if field.name in values and values[field.name] != value:
                    raise ConfigError(
                        f"hyperparameters {field.name} and its alias {name} disagree: "
                        f"{values[field.name]!r} vs {value!r}; give only one of them"
                    )
                values[field.name] = value
    unknown = {k: v for k, v in raw.items() if k not in known}
    if unknown and not allow_unknown:
        raise ConfigError(
            f"unknown hyperparameter(s) {', '.join(sorted(unknown))}; valid names are: "
            f"{', '.join(sorted(f.name for f, _ in _fields(cls)))}"
        )
    try:
        return cls(**values), unknown
    except ValueError as error:
        raise ConfigError(str(error)) from None


def describe(cls: type) -> list[dict[str, Any]]:
    """The declared hyperparameters as plain data (name, type, default, range, help)."""
    return [
        {
            "name": f.name,
            "type": kind.__name__,
            "default": f.default,
            "minimum": f.metadata["minimum"],
            "maximum": f.metadata["maximum"],
            "choices": list(f.metadata["choices"]) if f.metadata["choices"] else None,
            "aliases": list(f.metadata["aliases"]),
            "help": f.metadata["help"],
        }
        for f, kind in _fields(cls)
    ]
