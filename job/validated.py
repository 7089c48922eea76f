"""A job's hyperparameters, validated once: the launcher's settings, the mode, the trainer's.

hyperparameters.json mixes three kinds of keys: the launcher's own (`LaunchConfig`, with the
sagemaker-training toolkit's names as aliases), other `sagemaker_*` keys that the SDK adds
(ignored), and the user's. `validate_hyperparameters` is the one place that splits them,
decides the mode and checks the built-in trainer's config:

- script mode when `program` (or `sagemaker_program`) is set, else when SAGEMAKER_PROGRAM is
  in the environment (some tools set that instead); the script receives every user key, so
  none is checked here;
- otherwise the built-in trainer, whose `TrainerConfig` must parse from the user's keys; an
  unknown name is refused with the nearest valid one.

A job from SDK 3's `SourceCode` (job.source_code) says the same things in files: its
entry_script is the program, its `code` channel the submit directory, MPI's
process_count_per_node and mpi_additional_options the launcher's settings. A hyperparameter
given as well wins (mpi_options are joined, the hyperparameter's last, so they win per key).

An image built for others to run (`docker build --build-arg SCRIPT_MODE=off`, for an
algorithm registered with `sagemaker-ops register --no-script-mode`) carries the file
BUILTIN_ONLY_MARKER, and the launcher then passes builtin_only=True: a job that asks to run its
own code (a script, a submit directory, mpirun options, SDK 3's SourceCode) is refused before
anything of it is read. The marker is a file of the image, not an environment variable or a
hyperparameter, because whoever starts the algorithm's training job sets those.

The launcher calls it before planning and the operator tool (sagemaker_ops) before a job
is sent, so both refuse the same jobs with the same message.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from job.errors import ConfigError
from job.hyperparameters import decode, describe, names, parse, unpassable
from job.launch_config import OWN_CODE, SDK_PREFIX, LaunchConfig, split_hyperparameters
from job.paths import MlPaths
from job.source_code import SourceCode
from job.trainer_config import TrainerConfig

PROGRAM_ENV = "SAGEMAKER_PROGRAM"
SUBMIT_ENV = "SAGEMAKER_SUBMIT_DIRECTORY"
PROGRAM_KEY = "sagemaker_program"  # how the SDK names the script to the framework containers
# Written by the Dockerfile's SCRIPT_MODE=off (a test keeps the two equal); outside /opt/ml,
# where nothing of a job's input lands.
BUILTIN_ONLY_MARKER = Path("/etc/sagemaker-horovod-byoc/builtin-trainer-only")


@dataclass(frozen=True)
class JobHyperparameters:
    launch: LaunchConfig
    program: str  # the script under the code folder; "" runs the built-in trainer
    user: dict[str, Any]  # the user's keys, as given
    ignored: tuple[str, ...]  # the SDK's keys that the launcher ignores
    trainer: TrainerConfig | None  # the built-in trainer's config; None in script mode
    # Script mode: the decoded values a script sees through the toolkit (SM_HPS and the
    # sagemaker_* framework parameters), with sagemaker_program naming the script however
    # it was given, as the SDK always sends it.
    script: dict[str, Any] = field(default_factory=dict)


def validate_hyperparameters(
    raw: Mapping[str, Any],
    environ: Mapping[str, str],
    source: SourceCode | None = None,
    *,
    builtin_only: bool = False,
) -> JobHyperparameters:
    """Split and check a job's hyperparameters; ConfigError says what to change.
    `builtin_only`: the image runs its built-in trainer and nothing the job brings."""
    for name, value in raw.items():  # each may reach a rank's arguments or environment
        problem = unpassable([name, value, decode(value)])
        if problem:
            raise ConfigError(
                f"hyperparameter {name!r} holds {problem}, which no program can "
                "be handed: remove it from the job's hyperparameters"
            )
    launch, user, ignored = split_hyperparameters(raw)
    if builtin_only:
        refuse_own_code(raw, launch, environ, source)
    if source is not None:
        launch = with_source_code(launch, source, environ)
    program = launch.program or environ.get(PROGRAM_ENV, "")
    if program:
        script = {
            name: decode(value)
            for name, value in raw.items()
            if name in user or name.startswith(SDK_PREFIX)
        }
        return JobHyperparameters(
            launch, program, user, ignored, None, {**script, PROGRAM_KEY: program}
        )
    trainer, unknown = parse(TrainerConfig, user, allow_unknown=True)
    if unknown:
        raise _unknown_names(unknown)
    return JobHyperparameters(launch, "", user, ignored, trainer)


def refuse_own_code(
    raw: Mapping[str, Any],
    launch: LaunchConfig,
    environ: Mapping[str, str],
    source: SourceCode | None,
) -> None:
    """ConfigError naming each way this job asks to run code of its own, if any: the
    hyperparameters of OWN_CODE under any of their names, SAGEMAKER_PROGRAM or
    SAGEMAKER_SUBMIT_DIRECTORY, SDK 3's SourceCode. Empty values ask for nothing."""
    aliases = {info["name"]: info["aliases"] for info in describe(LaunchConfig)}
    given = [
        f"hyperparameter {key}"
        for name in OWN_CODE
        if getattr(launch, name)
        for key in (name, *aliases[name])
        if key in raw
    ]
    given += [
        f"environment variable {name}" for name in (PROGRAM_ENV, SUBMIT_ENV) if environ.get(name)
    ]
    if source is not None:
        given.append("SDK 3's source_code=SourceCode(...) (its sm_drivers channel)")
    if given:
        raise ConfigError(
            f"this algorithm runs only its built-in trainer (its image was built with "
            f"SCRIPT_MODE=off: no scripts, source directories or mpirun options of the job's "
            f"own): leave out {', '.join(given)}; the built-in trainer takes "
            f"{', '.join(sorted(names(TrainerConfig)))}"
        )


def submit_directory(launch: LaunchConfig, environ: Mapping[str, str]) -> str:
    """The job's submit directory URI (the hyperparameter, else SAGEMAKER_SUBMIT_DIRECTORY),
    "" when it has none."""
    return launch.submit_directory or environ.get(SUBMIT_ENV, "")


def with_source_code(
    launch: LaunchConfig, source: SourceCode, environ: Mapping[str, str]
) -> LaunchConfig:
    """The launcher's settings with what SDK 3's SourceCode and distributed= say."""
    if source.distribution == "torchrun":
        raise ConfigError(
            "ModelTrainer(distributed=Torchrun(...)) starts PyTorch's torchrun; "
            "this image runs TensorFlow ranks with mpirun: use "
            "distributed=MPI(process_count_per_node=...) or leave distributed out"
        )
    options = " ".join(
        part for part in (shlex.join(source.mpi_options), launch.mpi_options) if part
    )
    submit = submit_directory(launch, environ) or (
        str(source.code) if source.code != Path() else ""
    )
    return replace(
        launch,
        program=launch.program or source.entry_script,
        processes_per_host=launch.processes_per_host or source.processes_per_host,
        mpi_options=options,
        submit_directory=submit,
    )


def _unknown_names(unknown: Mapping[str, Any]) -> ConfigError:
    valid = sorted(names(TrainerConfig)) + sorted(names(LaunchConfig))
    hints = [
        f"{close[0]} for {key}"
        for key in sorted(unknown)
        for close in [difflib.get_close_matches(key, valid, n=1)]
        if close
    ]
    return ConfigError(
        f"unknown hyperparameter(s) {', '.join(sorted(unknown))}"
        + (f" (did you mean {', '.join(hints)}?)" if hints else "")
        + f"; the built-in trainer takes {', '.join(sorted(names(TrainerConfig)))}; "
        f"the launcher takes {', '.join(sorted(names(LaunchConfig)))}. To run your own "
        f"script, which receives any other key, set program=<file under {MlPaths().code_dir}>."
    )
