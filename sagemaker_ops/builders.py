"""Typed descriptions of what an operator asks SageMaker for, and the requests they become.

Each config is a frozen dataclass that checks itself against what this image supports
(`capabilities`) and against SageMaker's own rules that its schema does not carry (a spot job's
MaxWaitTimeInSeconds must be at least its MaxRuntimeInSeconds; at least one instance). Each
builder is a pure function from a config to the request dict of one API call, and returns it
only after `schema.validate` has accepted it. So everything refused is refused here, before
any client exists, with a message that says what to change; the edge (`aws.py`) only sends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from job.errors import ConfigError
from job.sagemaker_config import (
    InstanceGroup,
    check_served_input,
    group_names_problem,
    training_groups,
)

from . import capabilities as cap
from . import metrics, schema
from .hyperparameters import check_job_hyperparameters, supported_hyperparameters

MAX_RUNTIME_LIMIT = 28 * 24 * 3600  # SageMaker's upper bound on MaxRuntimeInSeconds
MAX_PAYLOAD_LIMIT_MB = 100  # batch transform's upper bound on MaxPayloadInMB
_S3_URI = re.compile(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(/.*)?")
_CHANNEL_NAME = re.compile(r"[A-Za-z0-9.\-_]+")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def check_s3_uri(value: str, what: str) -> str:
    """Refuse anything but s3://bucket[/prefix]; SageMaker would only say 'pattern mismatch'."""
    _require(
        bool(_S3_URI.fullmatch(value)),
        f"{what} {value!r} is not an S3 URI: expected s3://bucket/prefix, the bucket "
        "3-63 lowercase letters, digits, dots or hyphens",
    )
    return value


def _choice(value: str, allowed: tuple[str, ...], what: str, extra: str = "") -> None:
    _require(
        value in allowed,
        f"{what} {value!r} is not supported; choose one of {', '.join(allowed)}{extra}",
    )


def _at_least_one(count: int, what: str) -> None:
    _require(
        isinstance(count, int) and not isinstance(count, bool) and count >= 1,
        f"{what} must be a whole number of at least 1, got {count!r}",
    )


def default_name(base: str, now: datetime) -> str:
    """`base-YYYYmmdd-HHMMSS`, at most 63 characters (SageMaker's limit on resource names)."""
    stamp = now.strftime("%Y%m%d-%H%M%S")
    return f"{base[: 63 - len(stamp) - 1].rstrip('-')}-{stamp}"


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in tags.items()]


@dataclass(frozen=True)
class Vpc:
    """Subnets and security groups for jobs or models that must reach private resources."""

    subnets: tuple[str, ...]
    security_group_ids: tuple[str, ...]

    def __post_init__(self) -> None:
        _require(
            bool(self.subnets) and bool(self.security_group_ids),
            "a VPC needs both subnets and security groups: give --subnet and "
            "--security-group together (or neither)",
        )
        # Horovod's ranks talk to each other: the security group must allow traffic between
        # the job's own instances (SageMaker does not open it for you).

    def request(self) -> dict[str, list[str]]:
        return {"SecurityGroupIds": list(self.security_group_ids), "Subnets": list(self.subnets)}


@dataclass(frozen=True)
class TrainingChannel:
    """One S3 prefix mounted as /opt/ml/input/data/<name>."""

    name: str
    s3_uri: str
    distribution: str = "FullyReplicated"
    input_mode: str = "File"
    content_type: str = ""  # empty: not sent; the trainer then goes by the file names

    def __post_init__(self) -> None:
        _require(
            bool(_CHANNEL_NAME.fullmatch(self.name)),
            f"channel name {self.name!r} is invalid: use letters, digits, '.', '-', '_'",
        )
        check_s3_uri(self.s3_uri, f"channel {self.name}:")
        _choice(self.distribution, cap.S3_DISTRIBUTIONS, f"channel {self.name}: distribution")
        _choice(
            self.input_mode,
            cap.TRAINING_INPUT_MODES,
            f"channel {self.name}: input mode",
            " (Pipe streams FIFOs; the trainer reads files)" if self.input_mode == "Pipe" else "",
        )

    def request(self) -> dict[str, Any]:
        channel: dict[str, Any] = {
            "ChannelName": self.name,
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": self.s3_uri,
                    "S3DataDistributionType": self.distribution,
                }
            },
            "InputMode": self.input_mode,
        }
        if self.content_type:
            channel["ContentType"] = self.content_type
        return channel


@dataclass(frozen=True)
class TrainingJob:
    """A CreateTrainingJob, checked as the container will check it.

    `hyperparameters` may hold any JSON values; after construction it holds the string map
    that is sent, already accepted by the container's own parser. Managed spot is on when
    `spot` is set, and then `max_wait_seconds` (time waiting for capacity plus running) is
    required and at least `max_runtime_seconds`. A checkpoint URI makes SageMaker sync
    /opt/ml/checkpoints to S3, so a restarted or reclaimed spot job resumes from it.
    """

    name: str
    image: str
    role_arn: str
    output_path: str
    channels: tuple[TrainingChannel, ...]
    instance_type: str = "ml.m5.xlarge"
    instance_count: int = 1
    volume_size_gb: int = 30
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)
    max_runtime_seconds: int = 24 * 3600
    spot: bool = False
    max_wait_seconds: int | None = None
    checkpoint_s3_uri: str = ""
    vpc: Vpc | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    # SageMaker encrypts what the job's instances send each other: OpenMPI's links, TensorFlow's
    # workers and the coordinator send in the clear otherwise (docs/sagemaker.md); slower.
    encrypt_inter_container_traffic: bool = False
    # A warm pool: SageMaker keeps the instances this long after the job, and a next job with
    # the same image, instance type and count starts on them without provisioning.
    keep_alive_seconds: int = 0
    # TensorBoard event files (the trainer's /opt/ml/output/tensorboard) uploaded while it runs
    tensorboard_s3_uri: str = ""
    # A heterogeneous cluster: (name, instance type, count) per group, replacing instance_type
    # and instance_count; the groups that train go in sagemaker_distribution_instance_groups.
    instance_groups: tuple[tuple[str, str, int], ...] = ()

    def __post_init__(self) -> None:
        _at_least_one(self.instance_count, "instance count")
        _at_least_one(self.volume_size_gb, "volume size (GB)")
        _at_least_one(self.max_runtime_seconds, "max runtime (seconds)")
        _require(
            self.max_runtime_seconds <= MAX_RUNTIME_LIMIT,
            f"max runtime {self.max_runtime_seconds} s is above SageMaker's limit of "
            f"{MAX_RUNTIME_LIMIT} s (28 days)",
        )
        check_s3_uri(self.output_path, "output path")
        if self.checkpoint_s3_uri:
            check_s3_uri(self.checkpoint_s3_uri, "checkpoint S3 URI")
        if self.tensorboard_s3_uri:
            check_s3_uri(self.tensorboard_s3_uri, "TensorBoard S3 URI")
        _require(
            0 <= self.keep_alive_seconds <= cap.MAX_KEEP_ALIVE_SECONDS,
            f"keep-alive {self.keep_alive_seconds} s is outside SageMaker's warm-pool "
            f"range 0 .. {cap.MAX_KEEP_ALIVE_SECONDS} s",
        )
        _require(
            not (self.keep_alive_seconds and self.spot),
            "a warm pool (keep-alive) cannot be used with managed spot training",
        )
        self._check_spot()
        values, program = check_job_hyperparameters(self.hyperparameters, self.environment)
        self._check_groups(values, program)
        object.__setattr__(self, "hyperparameters", values)
        object.__setattr__(self, "channels", tuple(self.channels))
        self._check_channels(builtin_trainer=not program)

    def _check_groups(self, hyperparameters: Mapping[str, Any], program: str) -> None:
        """The groups as the API takes them, and as the launcher will read them: the ones that
        train named when there are several (the job would fail with exit code 2 otherwise)."""
        if not self.instance_groups:
            return
        names = [name for name, _, _ in self.instance_groups]
        problem = group_names_problem(names)
        _require(problem is None, f"instance groups: {problem}")
        for name, _, count in self.instance_groups:
            _at_least_one(count, f"instance group {name}'s count")
        groups = tuple(
            InstanceGroup(name, instance_type, tuple(f"{name}-{index}" for index in range(count)))
            for name, instance_type, count in self.instance_groups
        )
        setting = next(
            (
                str(hyperparameters[key])
                for key in (
                    "sagemaker_distribution_instance_groups",
                    "distribution_instance_groups",
                )
                if key in hyperparameters
            ),
            "",
        )
        check_served_input(
            builtin=not program,
            data_groups=len(training_groups(groups, setting)) < len(groups),
            train_sharded=any(
                c.name == "train" and c.distribution == "ShardedByS3Key" for c in self.channels
            ),
        )

    def _check_spot(self) -> None:
        if not self.spot:
            _require(
                self.max_wait_seconds is None,
                "max wait applies to managed spot training only: add --spot or drop --max-wait",
            )
            return
        if self.max_wait_seconds is None:
            raise ConfigError(
                "managed spot training needs a max wait (seconds to wait for spot capacity "
                f"plus running), at least the max runtime {self.max_runtime_seconds}"
            )
        _require(
            self.max_wait_seconds >= self.max_runtime_seconds,
            f"max wait {self.max_wait_seconds} s is less than max runtime "
            f"{self.max_runtime_seconds} s; SageMaker requires max wait >= max runtime: "
            "raise --max-wait or lower --max-runtime",
        )

    def _check_channels(self, builtin_trainer: bool) -> None:
        seen = [c.name for c in self.channels]
        duplicates = sorted({n for n in seen if seen.count(n) > 1})
        _require(not duplicates, f"channel(s) given twice: {', '.join(duplicates)}")
        if not builtin_trainer:
            return  # a user's script may read any channel and any format
        known = ", ".join(
            f"{n} ({'required' if r else 'optional'})" for n, r in cap.TRAINING_CHANNELS.items()
        )
        for channel in self.channels:
            _require(
                channel.name in cap.TRAINING_CHANNELS,
                f"unknown channel {channel.name!r}: the built-in trainer reads {known}; "
                "a script run with program=... may read others",
            )
            if channel.content_type:
                _choice(
                    channel.content_type,
                    cap.TRAINING_CONTENT_TYPES,
                    f"channel {channel.name}: content type",
                )
        for name, required in cap.TRAINING_CHANNELS.items():
            _require(
                not required or name in seen,
                f"missing channel {name!r}: the built-in trainer reads {known}; give it "
                f"as e.g. --channel {name}=s3://bucket/prefix/",
            )


def training_job_request(job: TrainingJob) -> dict[str, Any]:
    """The CreateTrainingJob request for `job`, validated against the API schema."""
    request: dict[str, Any] = {
        "TrainingJobName": job.name,
        "AlgorithmSpecification": {
            "TrainingImage": job.image,
            "TrainingInputMode": job.channels[0].input_mode if job.channels else "File",
            "MetricDefinitions": metrics.definitions(),
            "EnableSageMakerMetricsTimeSeries": True,
        },
        "RoleArn": job.role_arn,
        "HyperParameters": dict(job.hyperparameters),
        "InputDataConfig": [c.request() for c in job.channels],
        "OutputDataConfig": {"S3OutputPath": job.output_path},
        "ResourceConfig": {
            **(
                {
                    "InstanceGroups": [
                        {
                            "InstanceGroupName": name,
                            "InstanceType": instance_type,
                            "InstanceCount": count,
                        }
                        for name, instance_type, count in job.instance_groups
                    ]
                }
                if job.instance_groups
                else {"InstanceType": job.instance_type, "InstanceCount": job.instance_count}
            ),
            "VolumeSizeInGB": job.volume_size_gb,
            **(
                {"KeepAlivePeriodInSeconds": job.keep_alive_seconds}
                if job.keep_alive_seconds
                else {}
            ),
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": job.max_runtime_seconds},
        "EnableManagedSpotTraining": job.spot,
    }
    if not job.channels:
        del request["InputDataConfig"]
    if job.spot:
        request["StoppingCondition"]["MaxWaitTimeInSeconds"] = job.max_wait_seconds
    if job.checkpoint_s3_uri:
        request["CheckpointConfig"] = {
            "S3Uri": job.checkpoint_s3_uri,
            "LocalPath": cap.CHECKPOINT_LOCAL_PATH,
        }
    if job.tensorboard_s3_uri:
        request["TensorBoardOutputConfig"] = {
            "S3OutputPath": job.tensorboard_s3_uri,
            "LocalPath": cap.TENSORBOARD_LOCAL_PATH,
        }
    if job.environment:
        request["Environment"] = dict(job.environment)
    if job.vpc:
        request["VpcConfig"] = job.vpc.request()
    if job.encrypt_inter_container_traffic:
        request["EnableInterContainerTrafficEncryption"] = True
    if job.tags:
        request["Tags"] = _tag_list(job.tags)
    return schema.validate("CreateTrainingJob", request)


@dataclass(frozen=True)
class Algorithm:
    """The image registered as a SageMaker algorithm (usable from the console and tuning)."""

    name: str
    image: str
    description: str = (
        "Distributed Keras training with Horovod over OpenMPI on CSV, NPZ, "
        "TFRecord or image-folder data, and a model server for JSON, CSV, "
        "JSON lines and NPY."
    )
    training_instance_types: tuple[str, ...] = (
        cap.CPU_TRAINING_INSTANCE_TYPES + cap.GPU_TRAINING_INSTANCE_TYPES
    )
    realtime_instance_types: tuple[str, ...] = cap.REALTIME_INSTANCE_TYPES
    transform_instance_types: tuple[str, ...] = cap.TRANSFORM_INSTANCE_TYPES
    image_digest: str = ""  # sha256:...; pins the exact image when given
    # False: the image was built with SCRIPT_MODE=off (it refuses a job's own code), so the
    # spec offers none of the hyperparameters that would ask for it either.
    script_mode: bool = True


def algorithm_request(algorithm: Algorithm) -> dict[str, Any]:
    """The CreateAlgorithm request: every part generated from the container's definitions."""
    channels = [
        {
            "Name": name,
            "Description": f"{'Required' if required else 'Optional'} "
            f"{name} data: CSV without header, label first; or NPZ with arrays x and y.",
            "IsRequired": required,
            "SupportedContentTypes": list(cap.TRAINING_CONTENT_TYPES),
            "SupportedCompressionTypes": ["None"],
            "SupportedInputModes": list(cap.TRAINING_INPUT_MODES),
        }
        for name, required in cap.TRAINING_CHANNELS.items()
    ]
    training: dict[str, Any] = {
        "TrainingImage": algorithm.image,
        "SupportedHyperParameters": supported_hyperparameters(algorithm.script_mode),
        "SupportedTrainingInstanceTypes": list(algorithm.training_instance_types),
        "SupportsDistributedTraining": True,
        "MetricDefinitions": metrics.definitions(),
        "TrainingChannels": channels,
        "SupportedTuningJobObjectiveMetrics": metrics.tuning_objectives(),
    }
    container: dict[str, Any] = {"Image": algorithm.image}
    if algorithm.image_digest:
        training["TrainingImageDigest"] = container["ImageDigest"] = algorithm.image_digest
    request = {
        "AlgorithmName": algorithm.name,
        "AlgorithmDescription": algorithm.description,
        "TrainingSpecification": training,
        "InferenceSpecification": {
            "Containers": [container],
            "SupportedTransformInstanceTypes": list(algorithm.transform_instance_types),
            "SupportedRealtimeInferenceInstanceTypes": list(algorithm.realtime_instance_types),
            "SupportedContentTypes": list(cap.SERVING_CONTENT_TYPES),
            "SupportedResponseMIMETypes": list(cap.SERVING_RESPONSE_TYPES),
        },
    }
    return schema.validate("CreateAlgorithm", request)


def model_artifact(description: Mapping[str, Any]) -> str:
    """The model.tar.gz of a finished training job, from its DescribeTrainingJob answer."""
    name, status = description.get("TrainingJobName", "?"), description.get("TrainingJobStatus")
    _require(
        status == "Completed",
        f"training job {name} is {status}, not Completed: only a completed job has a model "
        "to deploy; wait for it (train --wait) or pass --model-data s3://.../model.tar.gz",
    )
    return check_s3_uri(description["ModelArtifacts"]["S3ModelArtifacts"], "model artifact")


@dataclass(frozen=True)
class Model:
    """A SageMaker model: this image's `serve` with a training job's model.tar.gz."""

    name: str
    image: str
    model_data_url: str
    role_arn: str
    environment: Mapping[str, str] = field(default_factory=dict)
    vpc: Vpc | None = None

    def __post_init__(self) -> None:
        check_s3_uri(self.model_data_url, "model data")


def model_request(model: Model) -> dict[str, Any]:
    request: dict[str, Any] = {
        "ModelName": model.name,
        "PrimaryContainer": {
            "Image": model.image,
            "ModelDataUrl": model.model_data_url,
            "Mode": "SingleModel",
        },
        "ExecutionRoleArn": model.role_arn,
    }
    if model.environment:
        request["PrimaryContainer"]["Environment"] = dict(model.environment)
    if model.vpc:
        request["VpcConfig"] = model.vpc.request()
    return schema.validate("CreateModel", request)


@dataclass(frozen=True)
class Endpoint:
    """A real-time endpoint serving one model from `instance_count` instances."""

    name: str
    model_name: str
    instance_type: str = "ml.m5.large"
    instance_count: int = 1
    variant_name: str = "AllTraffic"

    def __post_init__(self) -> None:
        _at_least_one(self.instance_count, "endpoint instance count")

    @property
    def config_name(self) -> str:
        return self.name  # one config per endpoint, named alike, so each is easy to find


def endpoint_config_request(endpoint: Endpoint) -> dict[str, Any]:
    return schema.validate(
        "CreateEndpointConfig",
        {
            "EndpointConfigName": endpoint.config_name,
            "ProductionVariants": [
                {
                    "VariantName": endpoint.variant_name,
                    "ModelName": endpoint.model_name,
                    "InstanceType": endpoint.instance_type,
                    "InitialInstanceCount": endpoint.instance_count,
                    "InitialVariantWeight": 1.0,
                }
            ],
        },
    )


def endpoint_request(endpoint: Endpoint) -> dict[str, Any]:
    return schema.validate(
        "CreateEndpoint",
        {"EndpointName": endpoint.name, "EndpointConfigName": endpoint.config_name},
    )


@dataclass(frozen=True)
class TransformJob:
    """A batch transform over an S3 prefix with `serve`.

    Line-based types (CSV, JSON lines) are split into records per line and reassembled line by
    line, so MultiRecord batches many rows per request; JSON and NPY bodies are whole
    documents and are sent one file per request (split type None).
    """

    name: str
    model_name: str
    input_s3_uri: str
    output_path: str
    content_type: str = "text/csv"
    accept: str = ""  # empty: the same type as the input
    instance_type: str = "ml.m5.xlarge"
    instance_count: int = 1
    split_type: str = ""  # empty: Line for line-based types, None otherwise
    batch_strategy: str = "MultiRecord"
    max_payload_mb: int = 6
    max_concurrent_transforms: int = 0  # 0: let SageMaker ask the container

    def __post_init__(self) -> None:
        check_s3_uri(self.input_s3_uri, "transform input")
        check_s3_uri(self.output_path, "transform output path")
        _choice(self.content_type, cap.SERVING_CONTENT_TYPES, "transform content type")
        _choice(self.response_type, cap.SERVING_RESPONSE_TYPES, "transform accept type")
        _choice(self.effective_split_type, ("Line", "None"), "split type")
        _require(
            self.effective_split_type == "None" or self.content_type in cap.LINE_CONTENT_TYPES,
            f"split type Line cuts {self.content_type} bodies apart; use split type None "
            f"for it (Line suits {', '.join(cap.LINE_CONTENT_TYPES)})",
        )
        _at_least_one(self.instance_count, "transform instance count")
        _require(
            isinstance(self.max_payload_mb, int)
            and 1 <= self.max_payload_mb <= MAX_PAYLOAD_LIMIT_MB,
            f"max payload must be 1-{MAX_PAYLOAD_LIMIT_MB} MB, got {self.max_payload_mb!r}",
        )
        _require(
            isinstance(self.max_concurrent_transforms, int) and self.max_concurrent_transforms >= 0,
            "max concurrent transforms must be 0 (automatic) or more, got "
            f"{self.max_concurrent_transforms!r}",
        )

    @property
    def response_type(self) -> str:
        return self.accept or self.content_type

    @property
    def effective_split_type(self) -> str:
        if self.split_type:
            return self.split_type
        return "Line" if self.content_type in cap.LINE_CONTENT_TYPES else "None"


def transform_job_request(job: TransformJob) -> dict[str, Any]:
    request: dict[str, Any] = {
        "TransformJobName": job.name,
        "ModelName": job.model_name,
        "BatchStrategy": job.batch_strategy,
        "MaxPayloadInMB": job.max_payload_mb,
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": job.input_s3_uri}},
            "ContentType": job.content_type,
            "SplitType": job.effective_split_type,
        },
        "TransformOutput": {
            "S3OutputPath": job.output_path,
            "Accept": job.response_type,
            "AssembleWith": "Line" if job.response_type in cap.LINE_CONTENT_TYPES else "None",
        },
        "TransformResources": {
            "InstanceType": job.instance_type,
            "InstanceCount": job.instance_count,
        },
    }
    if job.max_concurrent_transforms:
        request["MaxConcurrentTransforms"] = job.max_concurrent_transforms
    return schema.validate("CreateTransformJob", request)
