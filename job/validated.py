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

It also resolves, once and from the environment it is handed (never the process's own), what
the launcher's later steps read: the submit directory (`launch.submit_directory`: the
hyperparameter, else SAGEMAKER_SUBMIT_DIRECTORY, else SDK 3's code channel), the region that
fetches it (`region`), and, once the code is unpacked, the program's file (`program_file`).
The launch plan has the rest checked here too: which of this image's stacks serves the job
(`choose_backend`), what the built-in trainer's channels and a heterogeneous job's instance
groups must be (`check_builtin_channels`, `check_groups`).

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
from job.sagemaker_config import InstanceGroup, JobConfig, check_served_input
from job.source_code import SDK_CHANNELS, SourceCode
from job.trainer_config import JAX, TrainerConfig

PROGRAM_ENV = "SAGEMAKER_PROGRAM"
SUBMIT_ENV = "SAGEMAKER_SUBMIT_DIRECTORY"
PROGRAM_KEY = "sagemaker_program"  # how the SDK names the script to the framework containers
BUILTIN_CHANNELS = ("train", "validation", "weights")  # what the built-in trainer reads
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
    # Where boto3 fetches the submit directory: the SDK's sagemaker_region, else AWS_REGION;
    # None leaves boto3 to read AWS_DEFAULT_REGION itself.
    region: str | None = None

    def program_file(self, code_dir: Path) -> Path:
        """The script mode program's file, checked once the submit directory is unpacked into
        `code_dir`; ConfigError when it points outside that folder or is not there (naming
        the submit directory it should have come in)."""
        script = code_dir / self.program
        if not script.resolve().is_relative_to(code_dir.resolve()):
            raise ConfigError(
                f"script mode: program {self.program!r} points outside the "
                f"code folder {code_dir}; give a path inside it, such "
                "as 'train.py' or 'src/train.py'"
            )
        if not script.is_file():
            origin = self.launch.submit_directory
            raise ConfigError(
                f"script mode: program {self.program!r} is not in submit directory "
                f"{origin}; fix sagemaker_program (the SDK's entry_point) or add the file to "
                "source_dir"
                if origin
                else f"script mode: program {self.program!r} not found at {script}; put it "
                f"under {code_dir} or fix sagemaker_program"
            )
        return script


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
    launch = replace(
        launch, submit_directory=launch.submit_directory or environ.get(SUBMIT_ENV, "")
    )
    if source is not None:
        launch = with_source_code(launch, source)
    program = launch.program or environ.get(PROGRAM_ENV, "")
    region = str(decode(raw.get("sagemaker_region", "")) or environ.get("AWS_REGION", "")) or None
    if program:
        script = {
            name: decode(value)
            for name, value in raw.items()
            if name in user or name.startswith(SDK_PREFIX)
        }
        return JobHyperparameters(
            launch, program, user, ignored, None, {**script, PROGRAM_KEY: program}, region
        )
    trainer, unknown = parse(TrainerConfig, user, allow_unknown=True)
    if unknown:
        raise _unknown_names(unknown)
    return JobHyperparameters(launch, "", user, ignored, trainer, region=region)


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


def with_source_code(launch: LaunchConfig, source: SourceCode) -> LaunchConfig:
    """The launcher's settings with what SDK 3's SourceCode and distributed= say (a submit
    directory already given wins over its code channel)."""
    if source.distribution == "torchrun":
        raise ConfigError(
            "ModelTrainer(distributed=Torchrun(...)) starts PyTorch's torchrun; "
            "this image runs TensorFlow ranks with mpirun: use "
            "distributed=MPI(process_count_per_node=...) or leave distributed out"
        )
    options = " ".join(
        part for part in (shlex.join(source.mpi_options), launch.mpi_options) if part
    )
    submit = launch.submit_directory or (str(source.code) if source.code != Path() else "")
    return replace(
        launch,
        program=launch.program or source.entry_script,
        processes_per_host=launch.processes_per_host or source.processes_per_host,
        mpi_options=options,
        submit_directory=submit,
    )


def check_builtin_channels(job: JobConfig) -> None:
    """The built-in trainer's input: only its own channels (SDK 3's SourceCode brings its own
    two even when the command is our `train`), a train channel, none in Pipe mode."""
    sdk = SDK_CHANNELS if job.source_code else ()
    unknown = sorted(set(job.channels) - set(BUILTIN_CHANNELS) - set(sdk))
    if unknown:
        raise ConfigError(
            f"the built-in trainer reads channels {' and '.join(BUILTIN_CHANNELS)}; "
            f"unknown channel(s): {', '.join(unknown)}"
        )
    if "train" not in job.channels and not job.paths.channel("train").is_dir():
        raise ConfigError(
            "the built-in trainer needs a `train` channel "
            f"({job.paths.channel('train')} is missing); add an input channel "
            "named train with CSV, NPZ, TFRecord or image files"
        )
    for channel in job.channels.values():
        if channel.input_mode == "Pipe":
            raise ConfigError(
                f"channel {channel.name} uses Pipe input mode, which this "
                "container does not read; use File or FastFile"
            )


def check_groups(
    job: JobConfig,
    settings: JobHyperparameters,
    training: tuple[InstanceGroup, ...],
    data_hosts: tuple[str, ...],
) -> None:
    """What a heterogeneous job can run here: ranks per host the same on every training host;
    for the built-in trainer, whose data hosts serve its input, a training channel that
    reaches them whole."""
    types = sorted({group.instance_type for group in training})
    if len(types) > 1 and not settings.launch.processes_per_host:
        raise ConfigError(
            f"the training instance groups have different instance types "
            f"({', '.join(types)}): set processes_per_host, the ranks every one "
            "of their hosts runs"
        )
    train = job.channels.get("train")
    check_served_input(
        builtin=not settings.program,
        data_groups=bool(data_hosts),
        train_sharded=train is not None and train.sharded_by_host,
    )


# The two stacks one Dockerfile builds (its STACK build argument), by what they synchronise with.
HOROVOD, TENSORFLOW = "horovod", "tf"
IMAGES = {
    HOROVOD: "the Horovod image (TensorFlow 2.15, Keras 2; the default build)",
    TENSORFLOW: "the TensorFlow 2.21 image (docker build --build-arg STACK=tf)",
}
BACKENDS = {
    HOROVOD: "Horovod (sagemaker_mpi_enabled, the SDK's distribution={'mpi': ...})",
    TENSORFLOW: "MultiWorkerMirroredStrategy (sagemaker_multi_worker_mirrored_strategy_"
    "enabled, distribution={'multi_worker_mirrored_strategy': ...})",
}


def choose_backend(settings: JobHyperparameters, stack: str) -> str:
    """What the ranks synchronise with on the image of `stack`: what the job asks for, else
    the image's own stack; ConfigError naming the image to use when this image cannot serve
    the request (its distribution, or the built-in trainer on JAX)."""
    launch = settings.launch
    if launch.mpi_enabled and launch.multi_worker_mirrored_strategy:
        raise ConfigError(
            "the job enables both Horovod (sagemaker_mpi_enabled) and "
            "MultiWorkerMirroredStrategy (sagemaker_multi_worker_mirrored_"
            "strategy_enabled); set one distribution"
        )
    wanted = (
        HOROVOD
        if launch.mpi_enabled
        else TENSORFLOW
        if launch.multi_worker_mirrored_strategy
        else stack
    )
    if wanted != stack:
        raise ConfigError(
            f"the job asks for {BACKENDS[wanted]}, which this image ("
            f"{IMAGES[stack]}) does not have; run it on {IMAGES[wanted]}"
        )
    if settings.trainer is not None and settings.trainer.backend == JAX and stack != TENSORFLOW:
        raise ConfigError(
            f"backend=jax trains the built-in model with Keras 3 on JAX, which "
            f"{IMAGES[stack]} does not have; run it on {IMAGES[TENSORFLOW]}"
        )
    return wanted


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
