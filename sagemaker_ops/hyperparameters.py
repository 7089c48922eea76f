"""The job's hyperparameters, checked and described by the container's own definitions.

Two configs take hyperparameters: the launcher's `LaunchConfig` (how the cluster is formed)
and the built-in trainer's `TrainerConfig` (what is trained). Both are declared once with
`hp(...)`; this module never restates a name, type, range or default:

- `check_job_hyperparameters` runs the launcher's own check
  (`job.validated.validate_hyperparameters`) on a job's map before it is sent,
  so a typo or an out-of-range value fails here with the launcher's message instead of
  minutes later on a paid instance. Script mode (`program` or `sagemaker_program` set, or
  SAGEMAKER_PROGRAM in the job's environment) runs the user's script, which receives every key
  the launcher does not consume; those keys pass unchecked, and so do the other `sagemaker_*`
  keys (the SDK adds several), which the launcher ignores.
- `supported_hyperparameters` turns `describe(...)` into CreateAlgorithm's
  SupportedHyperParameters: int -> Integer, float -> Continuous (both with their declared
  range), str with choices and bool -> Categorical, any other str -> FreeText. Without script
  mode (an image built with SCRIPT_MODE=off) the launcher's settings that run the job's own
  code (`OWN_CODE`: program, submit_directory, mpi_options) are left out: the image refuses
  them, so the algorithm does not offer them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from job.hyperparameters import describe, encode
from job.launch_config import OWN_CODE, LaunchConfig
from job.trainer_config import TrainerConfig
from job.validated import validate_hyperparameters

DESCRIPTION_LIMIT = 1024  # EntityDescription's maximum in the SageMaker API
_SPEC_TYPES = {"int": "Integer", "float": "Continuous", "bool": "Categorical", "str": "FreeText"}
_RANGE_KEYS = {
    "Integer": "IntegerParameterRangeSpecification",
    "Continuous": "ContinuousParameterRangeSpecification",
}


def _spec(info: dict[str, Any], tunable: bool) -> dict[str, Any]:
    kind = _SPEC_TYPES[info["type"]]
    if info["choices"]:
        kind = "Categorical"
    spec: dict[str, Any] = {
        "Name": info["name"],
        "Type": kind,
        "Description": _shorten(info["help"]),
        "IsTunable": tunable and kind != "FreeText",
        "IsRequired": False,
        "DefaultValue": encode(info["default"]),
    }
    if kind in _RANGE_KEYS and info["minimum"] is not None and info["maximum"] is not None:
        cast = int if kind == "Integer" else float
        spec["Range"] = {
            _RANGE_KEYS[kind]: {
                "MinValue": encode(cast(info["minimum"])),
                "MaxValue": encode(cast(info["maximum"])),
            }
        }
    elif kind == "Categorical":
        values = info["choices"] or [encode(True), encode(False)]
        spec["Range"] = {"CategoricalParameterRangeSpecification": {"Values": list(values)}}
    return spec


def _shorten(text: str) -> str:
    return text if len(text) <= DESCRIPTION_LIMIT else text[: DESCRIPTION_LIMIT - 1] + "…"


def supported_hyperparameters(script_mode: bool = True) -> list[dict[str, Any]]:
    """SupportedHyperParameters: the trainer's (tunable) then the launcher's (not tunable),
    without those of OWN_CODE when the algorithm runs no code of the job's own."""
    left_out = () if script_mode else OWN_CODE
    return [_spec(info, tunable=True) for info in describe(TrainerConfig)] + [
        _spec(info, tunable=False)
        for info in describe(LaunchConfig)
        if info["name"] not in left_out
    ]


def check_job_hyperparameters(
    raw: Mapping[str, Any], environment: Mapping[str, str] | None = None
) -> tuple[dict[str, str], str]:
    """Validate a job's hyperparameters as the launcher will; return (the string map to send,
    the script or ''). ConfigError carries the launcher's message."""
    values = {str(key): encode(value) for key, value in raw.items()}
    return values, validate_hyperparameters(values, environment or {}).program
