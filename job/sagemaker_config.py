"""The job description SageMaker writes to /opt/ml/input/config, read into typed config.

- resourceconfig.json: `current_host`, `hosts` (sorted by SageMaker), `network_interface_name`
  (eth0 on most instances, eth1 in AWS's own example, ethwe in newer local mode),
  `current_instance_type`, and for a heterogeneous cluster `current_group_name` and
  `instance_groups` (each a name, an instance type and its hosts; SageMaker writes one group,
  `homogeneousCluster`, for a plain job, and local mode none). A missing file means a plain
  `docker run` outside SageMaker: one host named after `algo-1`, which is what local tools and
  tests expect.
- hyperparameters.json: a map of string to string (see job.hyperparameters for how
  values are decoded). Missing means no hyperparameters.
- inputdataconfig.json: per channel `ContentType`, `TrainingInputMode` (File | Pipe |
  FastFile) and `S3DistributionType` (FullyReplicated | ShardedByS3Key). Missing means
  every channel folder present under input/data is FullyReplicated File input.
- checkpointconfig.json and tensorboardoutputconfig.json: the `LocalPath` of the job's
  CheckpointConfig and TensorBoardOutputConfig, written only when the job has one (what
  SageMaker Debugger reads too); missing means /opt/ml/checkpoints and
  /opt/ml/output/tensorboard.
- input/data/sm_drivers/sourcecode.json and distributed.json: what SDK 3's ModelTrainer asked to
  run (job.source_code); absent for every other job.
Every problem is a ConfigError that names the file and the field to fix.

`write_job_config` writes the same three files as SageMaker does (its inverse): the default
job, the benchmarks, the local cluster and the tests make their jobs with it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from job.errors import ConfigError
from job.hyperparameters import decode, encode, unpassable
from job.paths import MlPaths
from job.source_code import SourceCode, read_source_code

INPUT_MODES = ("File", "FastFile", "Pipe")
DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")
INSTANCE_GROUP = "homogeneousCluster"  # SageMaker's name for the one group of a plain job
MAX_GROUPS = 5  # CreateTrainingJob's limit on ResourceConfig.InstanceGroups
# What mpirun's host list (`-H host:N,...`), ssh and the name service can take as one host:
# SageMaker's algo-N, a container's or an instance's DNS name, an IPv4 address.
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
INTERFACE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@-]{0,14}")  # Linux: at most 15 bytes
CHANNEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # CreateTrainingJob's ChannelName


def group_names_problem(names: list[str]) -> str | None:
    """What CreateTrainingJob would refuse in a job's instance group names (at most
    MAX_GROUPS, each named once, 1 to 64 characters), or None: one rule for the file SageMaker
    writes (resourceconfig.json) and the request sagemaker-ops builds, each naming its source."""
    if len(names) > MAX_GROUPS or len(set(names)) != len(names):
        return f"at most {MAX_GROUPS} groups, each named once; got {names}"
    long = [name for name in names if not 1 <= len(name) <= 64]
    if long:
        return f"each group name must be 1 to 64 characters; got {long}"
    return None


@dataclass(frozen=True)
class InstanceGroup:
    name: str
    instance_type: str
    hosts: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.name} ({len(self.hosts)} x {self.instance_type})"


@dataclass(frozen=True)
class ResourceConfig:
    """`groups` as resourceconfig.json lists them; empty for a job of one plain group."""

    current_host: str
    hosts: tuple[str, ...]
    network_interface_name: str = "eth0"
    instance_type: str = "local"
    current_group: str = INSTANCE_GROUP
    groups: tuple[InstanceGroup, ...] = ()

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError("resourceconfig.json: `hosts` is empty; it must list every host")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError(f"resourceconfig.json: `hosts` has duplicates: {list(self.hosts)}")
        if self.current_host not in self.hosts:
            raise ValueError(
                f"resourceconfig.json: current_host {self.current_host!r} is not among hosts "
                f"{list(self.hosts)}"
            )
        if self.groups:
            self._check_groups()

    def _check_groups(self) -> None:
        names = [group.name for group in self.groups]
        grouped = [host for group in self.groups for host in group.hosts]
        problem = group_names_problem(names)
        if problem:
            raise ValueError(f"resourceconfig.json: `instance_groups`: {problem}")
        if sorted(grouped) != sorted(self.hosts):
            raise ValueError(
                f"resourceconfig.json: the hosts of `instance_groups` "
                f"({sorted(grouped)}) must be `hosts` ({sorted(self.hosts)}), "
                "each in one group"
            )
        if self.current_host not in self.group(self.current_group).hosts:
            raise ValueError(
                f"resourceconfig.json: current_host {self.current_host!r} is not "
                f"in its group {self.current_group!r}"
            )

    @property
    def instance_groups(self) -> tuple[InstanceGroup, ...]:
        """Every group of the job: a plain job's one group when the file lists none."""
        return self.groups or (InstanceGroup(self.current_group, self.instance_type, self.hosts),)

    def group_of(self, host: str) -> InstanceGroup:
        return next(group for group in self.instance_groups if host in group.hosts)

    def group(self, name: str) -> InstanceGroup:
        found = [group for group in self.instance_groups if group.name == name]
        if not found:
            raise ValueError(
                f"resourceconfig.json: no instance group {name!r} among "
                f"{[group.name for group in self.instance_groups]}"
            )
        return found[0]


@dataclass(frozen=True)
class Channel:
    name: str
    content_type: str = ""
    input_mode: str = "File"
    distribution: str = "FullyReplicated"

    @property
    def sharded_by_host(self) -> bool:
        return self.distribution == "ShardedByS3Key"


@dataclass(frozen=True)
class JobConfig:
    """Everything under input/config, validated."""

    paths: MlPaths
    resources: ResourceConfig
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    channels: dict[str, Channel] = field(default_factory=dict)
    source_code: SourceCode | None = None  # SDK 3's SourceCode, when the job came from it


def training_groups(groups: tuple[InstanceGroup, ...], setting: str) -> tuple[InstanceGroup, ...]:
    """The instance groups whose hosts run the ranks: those `setting` names (the
    distribution_instance_groups hyperparameter: a JSON list or comma-separated names), else
    the job's only group. ConfigError when a job of several groups names none, or one it lacks."""
    value = decode(setting)
    names = (
        value
        if isinstance(value, list)
        else [name.strip() for name in str(value).split(",") if name.strip()]
        if value
        else []
    )
    listing = ", ".join(group.describe() for group in groups)
    if not names:
        if len(groups) == 1:
            return groups
        raise ConfigError(
            f"this job has {len(groups)} instance groups, {listing}, and names none to train: "
            "set the hyperparameter sagemaker_distribution_instance_groups to the groups whose "
            f"hosts run the ranks, such as '{groups[0].name}' or '[\"{groups[0].name}\"]' "
            '(SDK 2\'s framework estimators: distribution={..., "instance_groups": [...]}; '
            "sagemaker-ops train: --train-groups)"
        )
    known = {group.name: group for group in groups}
    unknown = [name for name in names if not isinstance(name, str) or name not in known]
    if unknown:
        raise ConfigError(
            f"sagemaker_distribution_instance_groups names {unknown}, "
            f"which this job does not have; its instance groups are {listing}"
        )
    return tuple(known[name] for name in dict.fromkeys(names))


_Json = TypeVar("_Json")


def _read_json(path: Path, expected: type[_Json]) -> _Json:
    try:
        value = json.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from None
    except RecursionError:
        raise ConfigError(f"{path} nests its JSON too deeply to be read") from None
    if not isinstance(value, expected):
        raise ConfigError(
            f"{path} must hold a JSON {expected.__name__}, not {type(value).__name__}"
        )
    return value


def read_resources(path: Path) -> ResourceConfig:
    if not path.exists():
        return ResourceConfig(current_host="algo-1", hosts=("algo-1",), network_interface_name="lo")
    raw = _read_json(path, dict)
    hosts = raw.get("hosts")
    if not isinstance(hosts, list) or not all(
        isinstance(h, str) and HOST_NAME.fullmatch(h) for h in hosts
    ):
        raise ConfigError(
            f"{path}: `hosts` must be a list of host names (letters, digits, "
            f"'.', '-', '_'), got {hosts!r}"
        )
    current = raw.get("current_host")
    if not isinstance(current, str) or not current:
        raise ConfigError(f"{path}: `current_host` must be a host name, got {current!r}")
    interface = raw.get("network_interface_name", "eth0")
    if not isinstance(interface, str) or not INTERFACE_NAME.fullmatch(interface):
        raise ConfigError(
            f"{path}: `network_interface_name` must be an interface name (such "
            f"as eth0), got {interface!r}"
        )
    group = raw.get("current_group_name", INSTANCE_GROUP)
    if not isinstance(group, str) or not 1 <= len(group) <= 64:
        raise ConfigError(
            f"{path}: `current_group_name` must be the name of an instance group "
            f"(1 to 64 characters), got {group!r}"
        )
    try:
        return ResourceConfig(
            current_host=current,
            hosts=tuple(sorted(hosts)),
            network_interface_name=interface,
            instance_type=str(raw.get("current_instance_type", "local")),
            current_group=group,
            groups=_read_groups(path, raw.get("instance_groups")),
        )
    except ValueError as error:
        raise ConfigError(f"{path}: {error}") from None


def _read_groups(path: Path, raw: Any) -> tuple[InstanceGroup, ...]:
    """The groups a heterogeneous job's file lists; () for one group (a plain job's
    homogeneousCluster tells nothing the host list does not) or none (local mode)."""
    if raw is None:
        return ()
    shape = 'a list of {"instance_group_name": NAME, "instance_type": TYPE, "hosts": [HOST, ...]}'
    if not isinstance(raw, list) or not all(isinstance(group, dict) for group in raw):
        raise ConfigError(f"{path}: `instance_groups` must be {shape}, got {raw!r}")
    groups = []
    for group in raw:
        name, hosts = group.get("instance_group_name"), group.get("hosts")
        if (
            not isinstance(name, str)
            or not 1 <= len(name) <= 64
            or not isinstance(hosts, list)
            or not hosts
            or not all(isinstance(host, str) and host for host in hosts)
        ):
            raise ConfigError(
                f"{path}: `instance_groups` must be {shape} (names of 1 to 64 "
                f"characters, at least one host each), got {group!r}"
            )
        groups.append(
            InstanceGroup(name, str(group.get("instance_type", "")), tuple(sorted(hosts)))
        )
    return tuple(groups) if len(groups) > 1 else ()


def read_hyperparameters(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    return _read_json(path, dict)


def read_channels(path: Path, data_dir: Path) -> dict[str, Channel]:
    if not path.exists():
        present = (
            sorted(p.name for p in data_dir.iterdir() if p.is_dir()) if data_dir.is_dir() else []
        )
        return {name: Channel(name) for name in present}
    channels = {}
    for name, spec in _read_json(path, dict).items():
        if not CHANNEL_NAME.fullmatch(name) or name in (".", ".."):
            raise ConfigError(
                f"{path}: channel name {name!r} is not one SageMaker gives: 1 to 64 "
                "letters, digits, '.', '-' and '_'"
            )
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: channel {name!r} must be a JSON object")
        mode = spec.get("TrainingInputMode", "File")
        distribution = spec.get("S3DistributionType", "FullyReplicated")
        if mode not in INPUT_MODES:
            raise ConfigError(
                f"{path}: channel {name!r} has TrainingInputMode {mode!r}; "
                f"choose between {', '.join(INPUT_MODES)}"
            )
        if distribution not in DISTRIBUTIONS:
            raise ConfigError(
                f"{path}: channel {name!r} has S3DistributionType "
                f"{distribution!r}; choose between {', '.join(DISTRIBUTIONS)}"
            )
        channels[name] = Channel(name, str(spec.get("ContentType", "")), mode, distribution)
    return channels


def _local_path(path: Path) -> Path | None:
    """The `LocalPath` a SageMaker output config file names, or None without the file."""
    if not path.exists():
        return None
    local = _read_json(path, dict).get("LocalPath")
    if not isinstance(local, str) or not local.startswith("/") or unpassable(local):
        raise ConfigError(f"{path}: `LocalPath` must be an absolute folder path, got {local!r}")
    return Path(local)


def configured_paths(root: Path) -> MlPaths:
    """The job's folders under `root`, with the checkpoint and TensorBoard folders it asked for."""
    paths = MlPaths(root)
    return MlPaths(
        root, _local_path(paths.checkpoint_config), _local_path(paths.tensorboard_config)
    )


def read_job_config(paths: MlPaths) -> JobConfig:
    """Read the config files under `paths.config_dir`."""
    paths = configured_paths(paths.root)
    return JobConfig(
        paths=paths,
        resources=read_resources(paths.resource_config),
        hyperparameters=read_hyperparameters(paths.hyperparameters),
        channels=read_channels(paths.input_data_config, paths.data_dir),
        source_code=read_source_code(paths),
    )


def resource_document(resources: ResourceConfig, host: str = "") -> dict[str, Any]:
    """resourceconfig.json as SageMaker writes it on `host` (default: the current host): every
    host and instance group, and that host's own group and instance type."""
    group = resources.group_of(host or resources.current_host)
    return {
        "current_host": host or resources.current_host,
        "current_instance_type": group.instance_type,
        "current_group_name": group.name,
        "hosts": sorted(resources.hosts),
        "instance_groups": [
            {
                "instance_group_name": g.name,
                "instance_type": g.instance_type,
                "hosts": list(g.hosts),
            }
            for g in resources.instance_groups
        ],
        "network_interface_name": resources.network_interface_name,
    }


def check_served_input(*, builtin: bool, data_groups: bool, train_sharded: bool) -> None:
    """The built-in trainer's data groups serve its input (tf.data service) and open the
    files the ranks name, so those must be on the data hosts too: ConfigError otherwise. One
    rule for the launcher (container.plan) and for sagemaker-ops before it sends a job."""
    if builtin and data_groups and train_sharded:
        raise ConfigError(
            "the train channel is ShardedByS3Key, but the data hosts serve the ranks' input "
            "(tf.data service) and read the files the ranks name: the train channel must be "
            "FullyReplicated"
        )


def write_job_config(job: JobConfig) -> None:
    """Write `job` under `job.paths.config_dir` as SageMaker writes it; read_job_config reads it
    back. Hyperparameter values may be any JSON value: each is written with `encode`."""
    paths = job.paths
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    _write_json(paths.resource_config, resource_document(job.resources))
    _write_json(
        paths.hyperparameters, {name: encode(value) for name, value in job.hyperparameters.items()}
    )
    _write_json(
        paths.input_data_config,
        {
            name: {
                "ContentType": channel.content_type,
                "TrainingInputMode": channel.input_mode,
                "S3DistributionType": channel.distribution,
                "RecordWrapperType": "None",
            }
            for name, channel in job.channels.items()
        },
    )


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
