"""SageMaker Python SDK 3's `SourceCode`, as it arrives in the container.

`ModelTrainer(source_code=SourceCode(source_dir, entry_script, requirements, command),
distributed=MPI(...) | Torchrun(...))` adds two input channels and says what to run in files,
not in hyperparameters (docs/sdk3-modeltrainer.md has the whole contract):

- channel `code`: the source_dir (SageMaker's copy of it, at input/data/code);
- channel `sm_drivers`: the SDK's driver scripts plus `sourcecode.json` (the SourceCode's
  fields as JSON) and `distributed.json` (`{}`, or MPI's `process_count_per_node` and
  `mpi_additional_options`, or Torchrun's `process_count_per_node` and `smp`).

The launcher reads them here, so that the user's entry script runs with every guarantee of
script mode (one job across the hosts, the failure file, exit codes, SIGTERM), however the
SDK's own driver was reached (container/sdk_handover.py hands it to `train`). Only a job that
has the `sm_drivers` channel with a sourcecode.json is such a job; a user's own channel named
`code` means nothing here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from job.errors import ConfigError
from job.hyperparameters import unpassable
from job.paths import MlPaths

CODE_CHANNEL = "code"
DRIVERS_CHANNEL = "sm_drivers"
SDK_CHANNELS = (CODE_CHANNEL, DRIVERS_CHANNEL)


@dataclass(frozen=True)
class SourceCode:
    """What SDK 3 asked to run. Empty strings and 0 mean "not given"."""

    entry_script: str = ""
    command: str = ""
    requirements: str = ""
    processes_per_host: int = 0  # MPI's or Torchrun's process_count_per_node
    mpi_options: tuple[str, ...] = ()  # MPI's mpi_additional_options
    distribution: str = ""  # "", "mpi" or "torchrun"
    # The user's code as it arrived: the `code` channel's folder, or the archive in it when
    # source_dir was a .tar.gz (SageMaker copies it unpacked); Path() when the job has none.
    code: Path = Path()


def read_source_code(paths: MlPaths) -> SourceCode | None:
    """The SDK 3 SourceCode of this job; None for a job that has none (SDK 2, the console,
    the API, this project's tools). ConfigError when the SDK's files cannot be read."""
    drivers = paths.channel(DRIVERS_CHANNEL)
    source_file, distributed_file = drivers / "sourcecode.json", drivers / "distributed.json"
    source = _read_object(source_file)
    if source is None:
        return None
    distributed = _read_object(distributed_file) or {}
    entry_script = _text(source, "entry_script", source_file)
    if entry_script and not entry_script.endswith(".py"):
        raise ConfigError(
            f"SourceCode entry_script {entry_script!r}: this image runs Python "
            "entry scripts on every rank; give a .py file (a shell script can "
            "run as SourceCode(command=...))"
        )
    code = paths.channel(CODE_CHANNEL)
    archive = _text(source, "source_dir", source_file)
    if archive.endswith(".tar.gz"):
        code = code / archive.rstrip("/").rpartition("/")[2]
    return SourceCode(
        entry_script=entry_script,
        command=_text(source, "command", source_file),
        requirements=_text(source, "requirements", source_file),
        processes_per_host=_count(distributed, distributed_file),
        mpi_options=_options(distributed, distributed_file),
        distribution=_distribution(distributed, distributed_file),
        code=code if code.exists() else Path(),
    )


def _read_object(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    except (ValueError, RecursionError) as error:  # RecursionError: nested past the parser
        raise ConfigError(
            f"{path} (written by the SageMaker SDK's ModelTrainer) is not valid "
            f"JSON: {error}; run the job again from the SDK"
        ) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path} must hold a JSON object, not {type(value).__name__}")
    return value


def _text(raw: dict[str, Any], key: str, path: Path) -> str:
    value = raw.get(key)
    if value is None:
        return ""
    if not isinstance(value, str) or unpassable(value):
        raise ConfigError(f"{path}: `{key}` must be a string a program can be given, got {value!r}")
    return value.strip()


def _count(raw: dict[str, Any], path: Path) -> int:
    value = raw.get("process_count_per_node")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{path}: process_count_per_node must be a positive whole number, got {value!r}"
        )
    return value


def _options(raw: dict[str, Any], path: Path) -> tuple[str, ...]:
    value = raw.get("mpi_additional_options")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(item, str) and not unpassable(item) for item in value
    ):
        raise ConfigError(
            f"{path}: mpi_additional_options must be a list of strings, such as "
            f'["-x", "NCCL_DEBUG=WARN"], got {value!r}'
        )
    return tuple(value)


def _distribution(raw: dict[str, Any], path: Path) -> str:
    if "mpi_additional_options" in raw:
        return "mpi"
    if "smp" in raw:
        return "torchrun"
    if raw.keys() - {"process_count_per_node"}:
        raise ConfigError(
            f"{path}: unknown distributed= configuration {raw!r}; this image "
            "runs distributed=MPI(...) or none"
        )
    return "mpi" if raw else ""
