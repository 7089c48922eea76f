"""Command line: arguments -> typed config -> validated requests -> print, or send and follow.

    sagemaker-ops train     ...  # CreateTrainingJob
    sagemaker-ops register  ...  # CreateAlgorithm
    sagemaker-ops deploy    ...  # CreateModel, CreateEndpointConfig, CreateEndpoint
    sagemaker-ops transform ...  # [CreateModel,] CreateTransformJob

Every verb takes `--dry-run` (print the requests as JSON, a list of {operation, request}; no
AWS call at all, except that `deploy/transform --training-job` reads where that job put its
model) and `--wait` (follow the status and CloudWatch logs until the resource settles).
Everything is checked before the first request is sent: exit status 2 means the input was
refused and nothing was sent; 1 means AWS refused a request or the followed resource failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from job.errors import ConfigError
from job.tracking import SECRET_VARIABLE, Tracking

from . import aws
from . import builders as b
from . import capabilities as cap

Plan = list[tuple[str, dict[str, Any]]]  # (operation, request), in sending order
Follow = tuple[aws.Watched, str, float]  # what to follow, its name, default timeout
DescribeJob = Callable[[str], dict[str, Any]]
FOLLOW_SLACK_SECONDS = 2 * 3600  # provisioning, download and upload around the run itself
_CHANNEL_KEY = re.compile(r"[A-Za-z0-9.\-_]+")
# Variables whose values are secrets, by their names (MLFLOW_TRACKING_TOKEN,
# AWS_SECRET_ACCESS_KEY, a user's API_KEY ...); an ARN naming a secret is not one.
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|ACCESS_KEY|"
    r"PRIVATE_KEY",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"^([a-z][a-z0-9+.\-]*://[^/@:]*:)[^/@]*@", re.IGNORECASE)
MASK = "****"


@dataclass(frozen=True)
class Delivery:
    """What to do with a plan: print it, or send it and perhaps follow what it started."""

    dry_run: bool = False
    wait: bool = False
    wait_timeout: float | None = None
    region: str | None = None
    profile: str | None = None


def _pairs(items: Sequence[str] | None, what: str) -> dict[str, str]:
    result = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {item!r} is not KEY=VALUE")
        result[key] = value
    return result


def _per_channel(
    items: Sequence[str] | None, channels: Sequence[str], default: str, what: str
) -> dict[str, str]:
    """`VALUE` sets every channel, `CHANNEL=VALUE` one of them (later items win)."""
    chosen = dict.fromkeys(channels, default)
    for item in items or ():
        key, sep, value = item.partition("=")
        if sep and _CHANNEL_KEY.fullmatch(key):
            if key not in chosen:
                raise ConfigError(
                    f"{what} {item!r} names channel {key!r}, which no --channel "
                    f"gives (channels: {', '.join(channels) or 'none'})"
                )
            chosen[key] = value
        else:
            chosen = dict.fromkeys(channels, item)
    return chosen


def _hyperparameters(pairs: Sequence[str] | None, path: str | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                loaded = json.load(handle)
        except (OSError, ValueError) as error:
            raise ConfigError(f"--hyperparameters {path}: {error}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"--hyperparameters {path}: expected a JSON object of name: value")
        values.update(loaded)
    values.update(_pairs(pairs, "--hp"))
    return values


def _vpc(args: argparse.Namespace) -> b.Vpc | None:
    if not args.subnet and not args.security_group:
        return None
    return b.Vpc(tuple(args.subnet or ()), tuple(args.security_group or ()))


def _name(given: str | None, base: str) -> str:
    return given or b.default_name(base, datetime.now(timezone.utc))


def training_job_from_args(args: argparse.Namespace) -> b.TrainingJob:
    channels = _pairs(args.channel, "--channel")
    names = list(channels)
    distribution = _per_channel(args.distribution, names, "FullyReplicated", "--distribution")
    input_mode = _per_channel(args.input_mode, names, "File", "--input-mode")
    content_type = _per_channel(args.content_type, names, "", "--content-type")
    hyperparameters = _hyperparameters(args.hp, args.hyperparameters)
    environment = _pairs(args.env, "--env")
    if args.mlflow:  # MLflow's own variables, which the launcher and scripts read
        environment["MLFLOW_TRACKING_URI"] = args.mlflow
    if args.mlflow_experiment:
        environment["MLFLOW_EXPERIMENT_NAME"] = args.mlflow_experiment
    if args.mlflow_token_secret:
        environment[SECRET_VARIABLE] = args.mlflow_token_secret
    _check_tracking(environment, given_uri=bool(args.mlflow))
    if args.train_groups:
        hyperparameters["sagemaker_distribution_instance_groups"] = json.dumps(
            [name.strip() for name in args.train_groups.split(",") if name.strip()]
        )
    return b.TrainingJob(
        name=_name(args.job_name, args.base_job_name),
        image=args.image,
        role_arn=args.role,
        output_path=args.output_path,
        channels=tuple(
            b.TrainingChannel(n, uri, distribution[n], input_mode[n], content_type[n])
            for n, uri in channels.items()
        ),
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        volume_size_gb=args.volume_size,
        hyperparameters=hyperparameters,
        instance_groups=tuple(_instance_group(text) for text in args.instance_group or ()),
        environment=environment,
        max_runtime_seconds=args.max_runtime,
        spot=args.spot,
        max_wait_seconds=args.max_wait,
        checkpoint_s3_uri=args.checkpoint_s3 or "",
        vpc=_vpc(args),
        tags=_pairs(args.tag, "--tag"),
        encrypt_inter_container_traffic=args.encrypt_inter_container_traffic,
        keep_alive_seconds=args.keep_alive,
        tensorboard_s3_uri=args.tensorboard_s3 or "",
    )


def _check_tracking(environment: dict[str, str], given_uri: bool) -> None:
    """Refuse a tracking server the job could not use; warn of credentials that would be
    seen: in the job's Environment (DescribeTrainingJob shows it to anyone allowed to
    describe jobs) or on the way (plain http to another host)."""
    tracking = (
        Tracking.from_environment(environment) if "MLFLOW_TRACKING_URI" in environment else None
    )
    if given_uri and tracking is None:
        raise ConfigError(
            f"--mlflow {environment['MLFLOW_TRACKING_URI']!r}: give an http(s):// "
            "tracking server or a SageMaker managed MLflow server's ARN"
        )
    for name in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD"):
        if environment.get(name):
            print(
                f"warning: {name} in the job's Environment is shown by DescribeTrainingJob "
                "to anyone allowed to describe jobs: store it in Secrets Manager and give "
                "--mlflow-token-secret ARN instead",
                file=sys.stderr,
            )
    if tracking is not None and tracking.plain_http_warning():
        print(f"warning: {tracking.plain_http_warning()}", file=sys.stderr)


def _instance_group(text: str) -> tuple[str, str, int]:
    """NAME:TYPE:COUNT -> (name, instance type, count)."""
    name, instance_type, count = (text.split(":") + ["", ""])[:3]
    if not name or not instance_type or not count.isdigit():
        raise ConfigError(
            f"--instance-group {text!r}: give NAME:TYPE:COUNT, such as train:ml.p4d.24xlarge:2"
        )
    return name, instance_type, int(count)


def algorithm_from_args(args: argparse.Namespace) -> b.Algorithm:
    given = {
        "description": args.description,
        "training_instance_types": args.training_instance_type,
        "realtime_instance_types": args.realtime_instance_type,
        "transform_instance_types": args.transform_instance_type,
    }
    changes: dict[str, Any] = {
        key: value if isinstance(value, str) else tuple(value)
        for key, value in given.items()
        if value
    }
    return dataclasses.replace(
        b.Algorithm(
            name=args.algorithm_name,
            image=args.image,
            image_digest=args.image_digest or "",
            script_mode=args.script_mode,
        ),
        **changes,
    )


def _model_from_args(args: argparse.Namespace, name: str, describe_job: DescribeJob) -> b.Model:
    if bool(args.training_job) == bool(args.model_data):
        raise ConfigError(
            "give the model as exactly one of --training-job NAME (a completed "
            "job) or --model-data s3://.../model.tar.gz"
        )
    if not (args.image and args.role):
        raise ConfigError(
            "creating a model needs --image (the serving image) and --role (or "
            "$SAGEMAKER_IMAGE_URI and $SAGEMAKER_ROLE_ARN)"
        )
    model_data = args.model_data or b.model_artifact(describe_job(args.training_job))
    return b.Model(
        name=name,
        image=args.image,
        model_data_url=model_data,
        role_arn=args.role,
        environment=_pairs(args.env, "--env"),
        vpc=_vpc(args),
    )


def deploy_plan(args: argparse.Namespace, describe_job: DescribeJob) -> tuple[Plan, str]:
    """CreateModel, CreateEndpointConfig and CreateEndpoint; returns the plan and endpoint."""
    endpoint_name = _name(args.endpoint_name, args.base_name)
    model = _model_from_args(args, args.model_name or endpoint_name, describe_job)
    endpoint = b.Endpoint(
        name=endpoint_name,
        model_name=model.name,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
    )
    return [
        ("CreateModel", b.model_request(model)),
        ("CreateEndpointConfig", b.endpoint_config_request(endpoint)),
        ("CreateEndpoint", b.endpoint_request(endpoint)),
    ], endpoint.name


def transform_plan(args: argparse.Namespace, describe_job: DescribeJob) -> tuple[Plan, str]:
    """[CreateModel,] CreateTransformJob; returns the plan and the transform job's name."""
    job_name = _name(args.job_name, args.base_name)
    plan: Plan = []
    model_name = args.model_name
    if args.training_job or args.model_data:
        model = _model_from_args(args, model_name or job_name, describe_job)
        plan.append(("CreateModel", b.model_request(model)))
        model_name = model.name
    elif not model_name:
        raise ConfigError(
            "name the model: --model-name of an existing SageMaker model, or "
            "--training-job/--model-data (with --image and --role) to create one"
        )
    job = b.TransformJob(
        name=job_name,
        model_name=model_name,
        input_s3_uri=args.input,
        output_path=args.output_path,
        content_type=args.content_type,
        accept=args.accept or "",
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        split_type=args.split_type or "",
        batch_strategy=args.batch_strategy,
        max_payload_mb=args.max_payload_mb,
        max_concurrent_transforms=args.max_concurrent_transforms,
    )
    plan.append(("CreateTransformJob", b.transform_job_request(job)))
    return plan, job.name


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run", action="store_true", help="print the requests as JSON and send nothing"
    )
    parser.add_argument(
        "--wait", action="store_true", help="follow status and CloudWatch logs until it settles"
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        metavar="SECONDS",
        help="stop following after this long (the resource keeps running)",
    )
    parser.add_argument("--region", default=os.environ.get("AWS_REGION"))
    parser.add_argument("--profile", default=os.environ.get("AWS_PROFILE"))


def _image_and_role(parser: argparse.ArgumentParser, required: bool = True) -> None:
    image, role = os.environ.get("SAGEMAKER_IMAGE_URI"), os.environ.get("SAGEMAKER_ROLE_ARN")
    parser.add_argument(
        "--image",
        default=image,
        required=required and not image,
        help="ECR image URI (default: $SAGEMAKER_IMAGE_URI)",
    )
    parser.add_argument(
        "--role",
        default=role,
        required=required and not role,
        help="IAM role SageMaker assumes (default: $SAGEMAKER_ROLE_ARN)",
    )


def _vpc_and_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--subnet", action="append", metavar="SUBNET_ID")
    parser.add_argument("--security-group", action="append", metavar="SG_ID")
    parser.add_argument(
        "--env",
        action="append",
        metavar="KEY=VALUE",
        help="environment variable of the container (repeatable)",
    )


def _model_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--training-job", metavar="NAME", help="a completed training job whose model.tar.gz to use"
    )
    parser.add_argument("--model-data", metavar="S3_URI", help="an explicit model.tar.gz")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="sagemaker-ops",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = top.add_subparsers(dest="verb", required=True)

    train = verbs.add_parser("train", help="launch a training job with this image")
    _image_and_role(train)
    train.add_argument(
        "--output-path",
        required=True,
        metavar="S3_URI",
        help="where SageMaker puts <job>/output/model.tar.gz",
    )
    train.add_argument("--job-name")
    train.add_argument("--base-job-name", default="horovod-keras")
    train.add_argument(
        "--channel",
        action="append",
        metavar="NAME=S3_URI",
        help=f"an input channel (repeatable): {', '.join(cap.TRAINING_CHANNELS)}",
    )
    train.add_argument(
        "--distribution",
        action="append",
        metavar="[CHANNEL=]TYPE",
        help=f"{' or '.join(cap.S3_DISTRIBUTIONS)} (default FullyReplicated)",
    )
    train.add_argument(
        "--input-mode",
        action="append",
        metavar="[CHANNEL=]MODE",
        help=f"{' or '.join(cap.TRAINING_INPUT_MODES)} (default File)",
    )
    train.add_argument(
        "--content-type",
        action="append",
        metavar="[CHANNEL=]TYPE",
        help=f"{' or '.join(cap.TRAINING_CONTENT_TYPES)}",
    )
    train.add_argument("--instance-type", default="ml.m5.xlarge")
    train.add_argument("--instance-count", type=int, default=1)
    train.add_argument(
        "--instance-group",
        action="append",
        metavar="NAME:TYPE:COUNT",
        help="a heterogeneous cluster: one per instance group (at most 5), "
        "instead of --instance-type and --instance-count",
    )
    train.add_argument(
        "--train-groups",
        metavar="NAME[,NAME]",
        help="the instance groups whose hosts run the ranks (the others run "
        "the script on their own); sets sagemaker_distribution_instance_groups",
    )
    train.add_argument("--volume-size", type=int, default=30, metavar="GB")
    train.add_argument(
        "--hp",
        action="append",
        metavar="NAME=VALUE",
        help="a hyperparameter (repeatable); checked by the trainer's parser",
    )
    train.add_argument(
        "--hyperparameters",
        metavar="FILE.json",
        help="hyperparameters as a JSON object (--hp entries win)",
    )
    train.add_argument("--max-runtime", type=int, default=24 * 3600, metavar="SECONDS")
    train.add_argument("--spot", action="store_true", help="managed spot training")
    train.add_argument(
        "--max-wait",
        type=int,
        metavar="SECONDS",
        help="spot only: waiting plus running time, >= --max-runtime",
    )
    train.add_argument(
        "--checkpoint-s3",
        metavar="S3_URI",
        help=f"synced with {cap.CHECKPOINT_LOCAL_PATH} so restarts resume",
    )
    train.add_argument(
        "--tensorboard-s3",
        metavar="S3_URI",
        help=f"where SageMaker uploads {cap.TENSORBOARD_LOCAL_PATH} while the job "
        "runs (the trainer's TensorBoard event files)",
    )
    train.add_argument(
        "--keep-alive",
        type=int,
        default=0,
        metavar="SECONDS",
        help="keep the instances this long in a warm pool after the job "
        f"(0 .. {cap.MAX_KEEP_ALIVE_SECONDS}); a next job on them starts at "
        "once and reuses the pip cache of its scripts' requirements",
    )
    train.add_argument(
        "--mlflow",
        metavar="URI_OR_ARN",
        help="log the job to this MLflow tracking server (MLFLOW_TRACKING_URI): "
        "an http(s):// URL or a SageMaker managed MLflow server's ARN",
    )
    train.add_argument(
        "--mlflow-experiment",
        metavar="NAME",
        help="the MLflow experiment (MLFLOW_EXPERIMENT_NAME; made when missing)",
    )
    train.add_argument(
        "--mlflow-token-secret",
        metavar="SECRET_ARN",
        help=f"a Secrets Manager secret holding the MLflow token ({SECRET_VARIABLE}"
        "; the job's role reads it at start): unlike MLFLOW_TRACKING_TOKEN, "
        "kept out of the job's description",
    )
    train.add_argument("--tag", action="append", metavar="KEY=VALUE")
    train.add_argument(
        "--encrypt-inter-container-traffic",
        action="store_true",
        help="SageMaker encrypts the traffic between the job's instances "
        "(EnableInterContainerTrafficEncryption; slower)",
    )
    _vpc_and_env(train)
    _common(train)

    register = verbs.add_parser("register", help="register the image as an algorithm")
    register.add_argument("--algorithm-name", required=True)
    register.add_argument(
        "--image",
        default=os.environ.get("SAGEMAKER_IMAGE_URI"),
        required=not os.environ.get("SAGEMAKER_IMAGE_URI"),
    )
    register.add_argument("--image-digest", metavar="sha256:...")
    register.add_argument("--description")
    register.add_argument(
        "--training-instance-type", action="append", help="replaces the default list (repeatable)"
    )
    register.add_argument("--realtime-instance-type", action="append")
    register.add_argument("--transform-instance-type", action="append")
    register.add_argument(
        "--no-script-mode",
        dest="script_mode",
        action="store_false",
        help="for an image built with SCRIPT_MODE=off: offer no "
        "program, submit_directory or mpi_options hyperparameter",
    )
    _common(register)

    deploy = verbs.add_parser("deploy", help="model + endpoint config + endpoint")
    _image_and_role(deploy)
    _model_source(deploy)
    deploy.add_argument("--endpoint-name")
    deploy.add_argument("--base-name", default="horovod-keras")
    deploy.add_argument("--model-name", help="default: the endpoint's name")
    deploy.add_argument("--instance-type", default="ml.m5.large")
    deploy.add_argument("--instance-count", type=int, default=1)
    _vpc_and_env(deploy)
    _common(deploy)

    transform = verbs.add_parser("transform", help="batch transform with the model")
    _image_and_role(transform, required=False)
    _model_source(transform)
    transform.add_argument("--model-name", help="an existing model, or the name to create")
    transform.add_argument("--job-name")
    transform.add_argument("--base-name", default="horovod-keras-transform")
    transform.add_argument("--input", required=True, metavar="S3_URI")
    transform.add_argument("--output-path", required=True, metavar="S3_URI")
    transform.add_argument(
        "--content-type", default="text/csv", help=f"one of {', '.join(cap.SERVING_CONTENT_TYPES)}"
    )
    transform.add_argument("--accept", help="response type (default: the content type)")
    transform.add_argument("--split-type", choices=("Line", "None"))
    transform.add_argument(
        "--batch-strategy", default="MultiRecord", choices=("MultiRecord", "SingleRecord")
    )
    transform.add_argument("--max-payload-mb", type=int, default=6)
    transform.add_argument("--max-concurrent-transforms", type=int, default=0)
    transform.add_argument("--instance-type", default="ml.m5.xlarge")
    transform.add_argument("--instance-count", type=int, default=1)
    _vpc_and_env(transform)
    _common(transform)
    return top


def train_plan(args: argparse.Namespace, describe_job: DescribeJob) -> tuple[Plan, Follow]:
    job = training_job_from_args(args)
    request = b.training_job_request(job)
    if job.spot and not job.checkpoint_s3_uri:
        print(
            "warning: a spot job without --checkpoint-s3 starts again from the first epoch "
            "after each interruption",
            file=sys.stderr,
        )
    # a spot job's max wait is set (validated); it bounds the job's life, else the runtime does
    limit = job.max_wait_seconds if job.spot and job.max_wait_seconds else job.max_runtime_seconds
    return [("CreateTrainingJob", request)], (
        aws.TRAINING_JOB,
        job.name,
        limit + FOLLOW_SLACK_SECONDS,
    )


def register_plan(args: argparse.Namespace, describe_job: DescribeJob) -> tuple[Plan, None]:
    return [("CreateAlgorithm", b.algorithm_request(algorithm_from_args(args)))], None


def _deploy(args: argparse.Namespace, describe_job: DescribeJob) -> tuple[Plan, Follow]:
    plan, name = deploy_plan(args, describe_job)
    return plan, (aws.ENDPOINT, name, 3600.0)


def _transform(args: argparse.Namespace, describe_job: DescribeJob) -> tuple[Plan, Follow]:
    plan, name = transform_plan(args, describe_job)
    return plan, (aws.TRANSFORM_JOB, name, 24 * 3600.0)


PLANNERS = {
    "train": train_plan,
    "register": register_plan,
    "deploy": _deploy,
    "transform": _transform,
}


class _Clients:
    """The AWS clients, made on first use: a dry run that reads nothing makes none."""

    def __init__(self, make: Callable[[], tuple[Any, Any]]):
        self._make = make
        self._pair: tuple[Any, Any] | None = None

    def pair(self) -> tuple[Any, Any]:
        if self._pair is None:
            self._pair = self._make()
        return self._pair

    def describe_training_job(self, name: str) -> dict[str, Any]:
        return aws.call(self.pair()[0], "DescribeTrainingJob", {"TrainingJobName": name})


def masked(request: dict[str, Any]) -> dict[str, Any]:
    """The request as printed: the values of its Environment's secrets (a token, a password,
    a key) and the password of a URL replaced by MASK; what is sent is not masked."""
    environment = request.get("Environment")
    if not environment:
        return request
    return {
        **request,
        "Environment": {
            name: MASK
            if SECRET_NAME.search(name) and not name.endswith("_ARN")
            else _URL_PASSWORD.sub(rf"\1{MASK}@", value)
            for name, value in environment.items()
        },
    }


def deliver(
    plan: Plan,
    follow: Follow | None,
    delivery: Delivery,
    clients: _Clients,
    out: Callable[[str], None] = print,
) -> int:
    """Print the plan (dry run), or send it in order and follow what it started."""
    if delivery.dry_run:
        out(
            json.dumps(
                [{"operation": op, "request": masked(request)} for op, request in plan], indent=2
            )
        )
        return 0
    sagemaker, logs = clients.pair()
    for operation, request in plan:
        print(f"sending {operation}", file=sys.stderr)
        response = aws.call(sagemaker, operation, request)
        arns = [v for k, v in response.items() if k.endswith("Arn")]
        out(f"{operation}: {arns[0] if arns else 'done'}")
    if not (delivery.wait and follow):
        return 0
    watched, name, default_timeout = follow
    description = aws.follow(
        sagemaker,
        logs,
        watched,
        name,
        out=out,
        timeout_seconds=delivery.wait_timeout or default_timeout,
    )
    succeeded, line = aws.outcome(watched, description)
    out(line)
    return 0 if succeeded else 1


def main(
    argv: Sequence[str] | None = None, make_clients: Callable[[], tuple[Any, Any]] | None = None
) -> int:
    args = parser().parse_args(argv)
    delivery = Delivery(args.dry_run, args.wait, args.wait_timeout, args.region, args.profile)
    clients = _Clients(make_clients or (lambda: aws.clients(delivery.region, delivery.profile)))
    try:
        plan, follow = PLANNERS[args.verb](args, clients.describe_training_job)
        return deliver(plan, follow, delivery, clients)
    except ConfigError as error:
        print(f"error: {error}\nnothing was sent", file=sys.stderr)
        return 2
    except (ClientError, BotoCoreError, aws.FollowTimeout) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
