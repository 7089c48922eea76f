"""Run this image as a local cluster of containers, the way SageMaker's local mode does.

    python scripts/local_cluster.py write --hosts 2 --data DIR [options]   # files only
    python scripts/local_cluster.py train --hosts 2 --data DIR [options]   # write, run, report
    python scripts/local_cluster.py serve --model DIR [--port 8080]        # serve a model

`write` makes, under --workdir (default build/local-cluster):
- docker-compose.yml: services algo-1 .. algo-N of --image, each with that hostname and
  network alias on one network (`sagemaker-local`, prefixed by the compose project),
  `command: train`, TRAINING_JOB_NAME in the environment;
- per host algo-i/: input/config/{resourceconfig,hyperparameters,inputdataconfig}.json
  (written by job.sagemaker_config.write_job_config, as SageMaker writes them; the
  interface is the container's: eth0 on a compose network), output/, model/ and
  checkpoints/, bind-mounted at /opt/ml/... in that host's container.
- channels: every sub-folder of --data is a channel, mounted read-only at
  /opt/ml/input/data/<channel>. Whole on every host (FullyReplicated), or, for the channels
  named by --sharded, split across the hosts file by file in sorted order, round robin
  (an imitation of ShardedByS3Key: with more hosts than files some hosts get nothing).
- hyperparameters: a JSON file (--hyperparameters) and/or --hp key=value (kept as the raw
  string); values are written as job.hyperparameters.encode writes them.
- instance groups (a heterogeneous cluster): --instance-group NAME:COUNT[:TYPE], once per
  group, instead of --hosts; hosts algo-1.. are dealt to the groups in the order given, and
  each host's resourceconfig.json names its group and lists them all, as SageMaker's does.
  Which groups train is the job's hyperparameter sagemaker_distribution_instance_groups.

`train` then runs `<compose> up --abort-on-container-exit` (docker compose with a Docker
daemon, else podman-compose; see scripts/engine.sh), waits for every container to exit,
prints each host's exit code and failure file and where the model landed, and always removes
the containers and the network (`down`). Exit status: 0 when every host exited 0.

`serve` runs `<engine> run IMAGE serve` with the model folder at /opt/ml/model, on --port.

The pure builders (job_config, shard, compose_file) are what the tests check; everything that
touches the disk or an engine is at the bottom.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from job.paths import MlPaths
from job.sagemaker_config import Channel, InstanceGroup, JobConfig, ResourceConfig, write_job_config

REPO = Path(__file__).resolve().parent.parent
NETWORK = "sagemaker-local"
IMAGE_PATHS = MlPaths()  # where SageMaker puts things inside the container
DEFAULT_IMAGE = "sagemaker-horovod:cpu"
TF_IMAGE = "sagemaker-horovod:tf-cpu"  # the TensorFlow 2.21 stack's CPU image (make build-tf)
DEFAULT_WORKDIR = REPO / "build" / "local-cluster"
CONTENT_TYPES = {
    ".csv": "text/csv",
    ".json": "application/json",
    ".jsonl": "application/jsonlines",
    ".npy": "application/x-npy",
    ".npz": "application/x-npz",
    ".parquet": "application/x-parquet",
}


# ----------------------------------------------------------------------------- the plan ---
@dataclass(frozen=True)
class ClusterSpec:
    """One local job: how many hosts, which image, what data and hyperparameters."""

    hosts: int
    workdir: Path
    data: Path | None = None
    image: str = DEFAULT_IMAGE
    sharded: frozenset[str] = frozenset()
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    job_name: str = "local-training-job"
    instance_type: str = "local"
    interface: str = "eth0"
    environment: Mapping[str, str] = field(default_factory=dict)
    # (name, host count, instance type) per instance group; () for one plain group
    groups: tuple[tuple[str, int, str], ...] = ()

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {self.hosts}")
        if self.groups and sum(count for _, count, _ in self.groups) != self.hosts:
            raise ValueError(
                f"the instance groups hold {sum(c for _, c, _ in self.groups)} "
                f"hosts, not {self.hosts}"
            )
        if self.sharded and self.data is None:
            raise ValueError("--sharded needs --data with the channels to split")

    @property
    def host_names(self) -> list[str]:
        return host_names(self.hosts)

    def channels(self) -> dict[str, Path]:
        """Channel name -> local folder: the sub-folders of --data."""
        if self.data is None:
            return {}
        found = {p.name: p.resolve() for p in sorted(self.data.iterdir()) if p.is_dir()}
        unknown = sorted(self.sharded - set(found))
        if unknown:
            raise ValueError(
                f"--sharded names channel(s) {', '.join(unknown)} not found in "
                f"{self.data}; channels there: {', '.join(found) or 'none'}"
            )
        return found


def host_names(count: int) -> list[str]:
    return [f"algo-{index}" for index in range(1, count + 1)]


def instance_groups(spec: ClusterSpec) -> tuple[InstanceGroup, ...]:
    """The spec's groups with their hosts, dealt in the order the groups were given."""
    names, first, groups = spec.host_names, 0, []
    for name, count, instance_type in spec.groups:
        groups.append(InstanceGroup(name, instance_type, tuple(names[first : first + count])))
        first += count
    return tuple(groups)


def parse_group(text: str) -> tuple[str, int, str]:
    """NAME:COUNT[:TYPE] -> (name, count, instance type; `local` when not given)."""
    name, _, rest = text.partition(":")
    count, _, instance_type = rest.partition(":")
    if not name or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME:COUNT[:TYPE], such as train:2:ml.p4d.24xlarge"
        )
    return name, int(count), instance_type or "local"


def content_type(folder: Path) -> str:
    """The channel's ContentType, from its files' extension (empty when unknown or mixed)."""
    kinds = {CONTENT_TYPES.get(p.suffix.lower(), "") for p in folder.rglob("*") if p.is_file()}
    return kinds.pop() if len(kinds) == 1 else ""


def job_config(spec: ClusterSpec, host: str) -> JobConfig:
    """The job SageMaker would describe to `host`, for its tree under the workdir."""
    channels = {
        name: Channel(
            name,
            content_type(folder),
            "File",
            "ShardedByS3Key" if name in spec.sharded else "FullyReplicated",
        )
        for name, folder in spec.channels().items()
    }
    groups = instance_groups(spec)
    group = next((g for g in groups if host in g.hosts), None)
    resources = (
        ResourceConfig(host, tuple(spec.host_names), spec.interface, spec.instance_type)
        if group is None
        else ResourceConfig(
            host, tuple(spec.host_names), spec.interface, group.instance_type, group.name, groups
        )
    )
    return JobConfig(host_paths(spec, host), resources, dict(spec.hyperparameters), channels)


def shard(files: Sequence[str], hosts: Sequence[str]) -> dict[str, list[str]]:
    """ShardedByS3Key imitation: sorted files dealt to the hosts in turn."""
    shards: dict[str, list[str]] = {host: [] for host in hosts}
    for index, name in enumerate(sorted(files)):
        shards[hosts[index % len(hosts)]].append(name)
    return shards


def host_paths(spec: ClusterSpec, host: str) -> MlPaths:
    """The host's tree under the workdir, mounted at IMAGE_PATHS in its container."""
    return MlPaths(spec.workdir.resolve() / host)


def channel_source(spec: ClusterSpec, host: str, name: str, folder: Path) -> Path:
    """What a host mounts for a channel: the folder itself, or its own shard."""
    if name in spec.sharded:
        return host_paths(spec, host).channel(name)
    return folder


def compose_file(spec: ClusterSpec) -> dict[str, Any]:
    """The docker-compose document for the cluster (plain data: written as YAML)."""
    channels = spec.channels()
    services = {}
    for host in spec.host_names:
        own, image = host_paths(spec, host), IMAGE_PATHS
        volumes = [
            f"{own.config_dir}:{image.config_dir}:ro",
            f"{own.output_dir}:{image.output_dir}",
            f"{own.model_dir}:{image.model_dir}",
            f"{own.checkpoint_dir}:{image.checkpoint_dir}",
        ]
        volumes += [
            f"{channel_source(spec, host, name, folder)}:{image.channel(name)}:ro"
            for name, folder in channels.items()
        ]
        services[host] = {
            "image": spec.image,
            "hostname": host,
            "command": ["train"],
            "environment": {"TRAINING_JOB_NAME": spec.job_name, **spec.environment},
            "volumes": volumes,
            "networks": {NETWORK: {"aliases": [host]}},
            # SageMaker sends SIGTERM and kills 120 s later; `down` allows the same.
            "stop_grace_period": "120s",
        }
    return {
        "services": services,
        "networks": {NETWORK: {}},
        # podman-compose would otherwise put every service in one pod, sharing one
        # network namespace (one address for all hosts); docker compose ignores x- keys.
        "x-podman": {"in_pod": False},
    }


# ------------------------------------------------------------------------ the files -------
def write_cluster(spec: ClusterSpec) -> Path:
    """Write the compose file and every host's tree; returns the compose file's path."""
    import yaml

    workdir = spec.workdir.resolve()
    channels = spec.channels()
    hosts = spec.host_names
    for host in hosts:
        job = job_config(spec, host)
        if job.paths.root.exists():
            shutil.rmtree(job.paths.root)
        write_job_config(job)
        for folder in (job.paths.output_dir, job.paths.model_dir, job.paths.checkpoint_dir):
            folder.mkdir(parents=True)
    for name in sorted(spec.sharded):
        folder = channels[name]
        files = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
        for host, names in shard(files, hosts).items():
            target = channel_source(spec, host, name, folder)
            target.mkdir(parents=True, exist_ok=True)
            for relative in names:
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(folder / relative, target / relative)
    path = workdir / "docker-compose.yml"
    path.write_text(
        "# Written by scripts/local_cluster.py; rewritten on every run.\n"
        + yaml.safe_dump(compose_file(spec), sort_keys=False)
    )
    return path


def read_hyperparameters(path: Path | None, pairs: Sequence[str]) -> dict[str, Any]:
    """The JSON file's hyperparameters, then the key=value pairs from the command line (raw
    strings), which win."""
    values: dict[str, Any] = {}
    if path is not None:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"{path} must hold a JSON object of hyperparameters")
        values.update(raw)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--hp expects key=value, got {pair!r}")
        values[key] = value
    return values


# -------------------------------------------------------------------------- the engine ----
@dataclass(frozen=True)
class Engine:
    """The container engine scripts/engine.sh chose, and the environment to run it with."""

    name: str
    env: Mapping[str, str]

    @classmethod
    def detect(cls) -> Engine:
        """What scripts/engine.sh picks (the one rule, shared with the Makefile and the shell
        scripts); RuntimeError with its reason when it finds none."""
        script = (
            f'source {REPO / "scripts" / "engine.sh"} && echo "$ENGINE" && '
            'echo "${CONTAINERS_CONF:-}"'
        )
        found = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        if found.returncode:
            raise RuntimeError(found.stderr.strip() or "scripts/engine.sh found no engine")
        name, conf = found.stdout.split("\n")[:2]
        return cls(name, {**os.environ, **({"CONTAINERS_CONF": conf} if conf else {})})

    def compose_command(self) -> list[str]:
        if self.name == "docker":
            probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
            return ["docker", "compose"] if probe.returncode == 0 else ["docker-compose"]
        local = Path(sys.executable).with_name("podman-compose")
        return [str(local)] if local.exists() else ["podman-compose"]

    def run(
        self, *args: str, check: bool = True, capture: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.name, *args],
            env=dict(self.env),
            check=check,
            capture_output=capture,
            text=True,
            timeout=timeout,
        )

    def labelled(self, having: str, *labels: str, check: bool = True) -> list[list[str]]:
        """Each container (running or not) with the label `having` (`key` or `key=value`): the
        values of `labels`, then its full id. One `ps`, so that a container the engine is still
        creating or removing is never listed by one call and missing in the next (Docker's
        template names a label .Label "key", podman's index .Labels "key")."""
        field = '.Label "{}"' if self.name == "docker" else 'index .Labels "{}"'
        template = "".join("{{" + field.format(label) + "}} " for label in labels) + "{{.ID}}"
        lines = self.run(
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            f"label={having}",
            "--format",
            template,
            check=check,
        ).stdout
        return [line.split() for line in lines.splitlines() if line.strip()]


@dataclass
class ComposeCluster:
    """A written cluster, run with compose under one project name."""

    engine: Engine
    compose_path: Path
    project: str

    def compose(
        self, *args: str, check: bool = True, capture: bool = False, timeout: float | None = None
    ) -> subprocess.CompletedProcess:
        argv = [
            *self.engine.compose_command(),
            "-p",
            self.project,
            "-f",
            str(self.compose_path),
            *args,
        ]
        return subprocess.run(
            argv,
            env=dict(self.engine.env),
            check=check,
            capture_output=capture,
            text=True,
            timeout=timeout,
        )

    def containers(self) -> dict[str, str]:
        """Service (host) name -> container id, for this project's containers."""
        return dict(
            self.engine.labelled(
                f"com.docker.compose.project={self.project}", "com.docker.compose.service"
            )
        )

    def state(self, host: str) -> dict[str, Any]:
        return self._state(self.containers()[host])

    def _state(self, container: str) -> dict[str, Any]:
        return json.loads(
            self.engine.run("inspect", "--format", "{{json .State}}", container).stdout
        )

    def wait_all_exited(self, timeout: float) -> dict[str, int]:
        """Poll until every container has exited; host -> exit code. TimeoutError names the
        hosts still running."""
        deadline = time.monotonic() + timeout
        while True:
            states = {host: self._state(container) for host, container in self.containers().items()}
            running = sorted(h for h, s in states.items() if s.get("Running"))
            if not running:
                return {host: int(s.get("ExitCode", -1)) for host, s in states.items()}
            if time.monotonic() >= deadline:
                raise TimeoutError(f"still running after {timeout:g} s: {', '.join(running)}")
            time.sleep(0.5)

    def logs(self, host: str) -> str:
        result = self.engine.run("logs", self.containers()[host], check=False)
        return result.stdout + result.stderr

    def down(self) -> None:
        """Remove the containers and the network; never raises (used in cleanups)."""
        self.compose("down", "-t", "10", check=False, capture=True, timeout=300)


# ---------------------------------------------------------------------------- commands ----
def spec_from_arguments(args: argparse.Namespace) -> ClusterSpec:
    groups = tuple(args.instance_group)
    return ClusterSpec(
        hosts=sum(count for _, count, _ in groups) if groups else args.hosts,
        groups=groups,
        workdir=args.workdir,
        data=args.data,
        image=args.image,
        sharded=frozenset(args.sharded),
        hyperparameters=read_hyperparameters(args.hyperparameters, args.hp),
        job_name=args.job_name,
        instance_type=args.instance_type,
        environment=dict(pair.split("=", 1) for pair in args.env),
    )


def train(spec: ClusterSpec, project: str, wait_timeout: float) -> int:
    path = write_cluster(spec)
    engine = Engine.detect()
    cluster = ComposeCluster(engine, path, project)
    print(
        f"local_cluster: {spec.hosts} host(s) of {spec.image} with {engine.name}; "
        f"compose file {path}",
        flush=True,
    )
    try:
        cluster.compose("up", "--abort-on-container-exit", check=False)
        try:
            codes = cluster.wait_all_exited(wait_timeout)
        except TimeoutError as error:
            print(f"local_cluster: {error}; stopping them", file=sys.stderr, flush=True)
            codes = {host: -1 for host in spec.host_names}
    finally:
        cluster.down()
    return report(spec, codes)


def report(spec: ClusterSpec, codes: Mapping[str, int]) -> int:
    for host in spec.host_names:
        failure = host_paths(spec, host).failure_file
        reason = f": {failure.read_text().strip()}" if failure.exists() else ""
        print(f"local_cluster: {host} exited {codes.get(host, 'never started')}{reason}")
    model = host_paths(spec, spec.host_names[0]).model_dir
    if all(code == 0 for code in codes.values()) and len(codes) == spec.hosts:
        print(f"local_cluster: job completed; the model is in {model}")
        return 0
    print("local_cluster: job FAILED", file=sys.stderr)
    return 1


def serve(image: str, model: Path, port: int) -> int:
    if not model.is_dir() or not any(model.iterdir()):
        print(f"local_cluster: no model in {model}; run `make local-train` first", file=sys.stderr)
        return 1
    engine = Engine.detect()
    argv = [
        engine.name,
        "run",
        "--rm",
        "-p",
        f"{port}:8080",
        "-v",
        f"{model.resolve()}:{IMAGE_PATHS.model_dir}:ro",
        image,
        "serve",
    ]
    print(
        f"local_cluster: serving {model} on http://localhost:{port} "
        f"(/ping, /invocations); Ctrl-C stops it",
        flush=True,
    )
    return subprocess.run(argv, env=dict(engine.env)).returncode


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="local_cluster.py", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("write", "train"):
        sub = commands.add_parser(name)
        sub.add_argument("--hosts", type=int, default=2)
        sub.add_argument(
            "--instance-group",
            action="append",
            default=[],
            type=parse_group,
            metavar="NAME:COUNT[:TYPE]",
            help="a heterogeneous cluster: one per group, instead of --hosts",
        )
        sub.add_argument("--image", default=DEFAULT_IMAGE)
        sub.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
        sub.add_argument("--data", type=Path, help="folder whose sub-folders are the channels")
        sub.add_argument(
            "--sharded",
            action="append",
            default=[],
            metavar="CHANNEL",
            help="split this channel across the hosts (ShardedByS3Key)",
        )
        sub.add_argument("--hyperparameters", type=Path, help="JSON file of hyperparameters")
        sub.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE")
        sub.add_argument(
            "--env",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="extra environment for every container",
        )
        sub.add_argument("--job-name", default="local-training-job")
        sub.add_argument("--instance-type", default="local")
        if name == "train":
            sub.add_argument(
                "--project",
                default="sagemaker-local",
                help="compose project name (prefixes containers and network)",
            )
            sub.add_argument(
                "--wait-timeout",
                type=float,
                default=300.0,
                help="seconds to wait for the hosts to exit after the first one",
            )
    sub = commands.add_parser("serve")
    sub.add_argument("--image", default=DEFAULT_IMAGE)
    sub.add_argument("--model", type=Path, default=DEFAULT_WORKDIR / "algo-1" / "model")
    sub.add_argument("--port", type=int, default=8080)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.command == "serve":
        return serve(args.image, args.model, args.port)
    try:
        spec = spec_from_arguments(args)
    except ValueError as error:
        print(f"local_cluster: {error}", file=sys.stderr)
        return 2
    if args.command == "write":
        print(write_cluster(spec))
        return 0
    return train(spec, args.project, args.wait_timeout)


if __name__ == "__main__":
    sys.exit(main())
