"""The job's hyperparameters, checked and described by the container's own definitions.

Two configs take hyperparameters: the launcher's `LaunchConfig` (how the cluster is formed)
and the built-in trainer's `TrainerConfig` (what is trained). Both are declared once with
`hp(...)`; this module never restates a name, type, range or default:

- `check_job_hyperparameters` splits a job's map as the launcher does and runs the
  container's `parse` on it before it is sent,
  so a typo or an out-of-range value fails here with the trainer's own message instead of
  minutes later on a paid instance. Script mode (`program` or `sagemaker_program` set, or
  SAGEMAKER_PROGRAM in the environment) runs the user's script, which receives every key the
  launcher does not consume; those keys are then passed through unchecked. Other `sagemaker_*`
  keys (the SDK adds several) are consumed and ignored by the launcher, so they pass too.
- `supported_hyperparameters` turns `describe(...)` into CreateAlgorithm's
  SupportedHyperParameters: int -> Integer, float -> Continuous (both with their declared
  range), str with choices and bool -> Categorical, any other str -> FreeText.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, Mapping

from container.errors import ConfigError
from container.hyperparameters import describe, names, parse
from container.launch_config import LaunchConfig, split_hyperparameters
from train.hyperparameters import TrainerConfig

DESCRIPTION_LIMIT = 1024  # EntityDescription's maximum in the SageMaker API
_SPEC_TYPES = {"int": "Integer", "float": "Continuous", "bool": "Categorical", "str": "FreeText"}
_RANGE_KEYS = {"Integer": "IntegerParameterRangeSpecification",
               "Continuous": "ContinuousParameterRangeSpecification"}


def as_text(value: Any) -> str:
    """A hyperparameter value as SageMaker carries it: a string that `parse` decodes back."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _spec(info: dict[str, Any], tunable: bool) -> dict[str, Any]:
    kind = _SPEC_TYPES[info["type"]]
    if info["choices"]:
        kind = "Categorical"
    spec: dict[str, Any] = {"Name": info["name"], "Type": kind,
                            "Description": _shorten(info["help"]),
                            "IsTunable": tunable and kind != "FreeText", "IsRequired": False,
                            "DefaultValue": as_text(info["default"])}
    if kind in _RANGE_KEYS and info["minimum"] is not None and info["maximum"] is not None:
        cast = int if kind == "Integer" else float
        spec["Range"] = {_RANGE_KEYS[kind]: {"MinValue": as_text(cast(info["minimum"])),
                                             "MaxValue": as_text(cast(info["maximum"]))}}
    elif kind == "Categorical":
        values = info["choices"] or [as_text(True), as_text(False)]
        spec["Range"] = {"CategoricalParameterRangeSpecification": {"Values": list(values)}}
    return spec


def _shorten(text: str) -> str:
    return text if len(text) <= DESCRIPTION_LIMIT else text[:DESCRIPTION_LIMIT - 1] + "…"


def supported_hyperparameters() -> list[dict[str, Any]]:
    """SupportedHyperParameters: the trainer's (tunable) then the launcher's (not tunable)."""
    return ([_spec(info, tunable=True) for info in describe(TrainerConfig)]
            + [_spec(info, tunable=False) for info in describe(LaunchConfig)])


def check_job_hyperparameters(raw: Mapping[str, Any],
                              environment: Mapping[str, str] | None = None
                              ) -> tuple[dict[str, str], str]:
    """Validate a job's hyperparameters; return (the string map to send, the script or '').

    Raises ConfigError with the container's message for a bad value, and for an unknown name
    (built-in trainer only) with the names that are valid and the nearest ones.
    """
    values = {str(key): as_text(value) for key, value in raw.items()}
    launch, user, _ = split_hyperparameters(values)  # the launcher's own split
    program = launch.program or (environment or {}).get("SAGEMAKER_PROGRAM", "")
    if program:
        return values, program
    _, unknown = parse(TrainerConfig, user, allow_unknown=True)
    if unknown:
        valid = sorted(names(TrainerConfig)) + sorted(names(LaunchConfig))
        hints = [f"{close[0]} for {key}" for key in sorted(unknown)
                 for close in [difflib.get_close_matches(key, valid, n=1)] if close]
        raise ConfigError(
            f"unknown hyperparameter(s) {', '.join(sorted(unknown))}"
            + (f" (did you mean {', '.join(hints)}?)" if hints else "")
            + f"; the built-in trainer takes {', '.join(sorted(names(TrainerConfig)))}; "
            f"the launcher takes {', '.join(sorted(names(LaunchConfig)))}. To run your own "
            "script, which receives any other key, set program=<file under /opt/ml/code>.")
    return values, ""
