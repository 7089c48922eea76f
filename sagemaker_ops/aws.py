"""The edge: the only module that talks to AWS. It sends built requests and follows what started.

Following a resource means polling its Describe call until its status settles, printing each
change of status (and a training job's secondary status: Starting, Downloading, Training,
Uploading ...), and printing the CloudWatch log events of its instances as they arrive, one
line each, prefixed by the log stream (the host). Logs go to
`/aws/sagemaker/TrainingJobs` (streams `<job>/algo-N-<time>`), `/aws/sagemaker/TransformJobs`
and `/aws/sagemaker/Endpoints/<endpoint>`; a log group appears only once an instance writes.

Following has a deadline: when it passes, the resource keeps running on SageMaker and the
error says how to follow it again. The clock and the sleep are parameters, so tests drive a
follow loop through botocore's Stubber without waiting and without a network.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore import xform_name
from botocore.exceptions import ClientError


class FollowTimeout(Exception):
    """Stopped following before the resource settled; it keeps running on SageMaker."""


@dataclass(frozen=True)
class Watched:
    """How one kind of SageMaker resource is described, when it is settled, where it logs."""

    kind: str
    describe: str
    name_key: str
    status_key: str
    succeeded: frozenset[str]
    failed: frozenset[str]
    log_group: str  # formatted with name=
    stream_prefix: str  # formatted with name=

    def settled(self, status: str) -> bool:
        return status in self.succeeded or status in self.failed


TRAINING_JOB = Watched(
    "training job",
    "DescribeTrainingJob",
    "TrainingJobName",
    "TrainingJobStatus",
    frozenset({"Completed"}),
    frozenset({"Failed", "Stopped"}),
    "/aws/sagemaker/TrainingJobs",
    "{name}/",
)
TRANSFORM_JOB = Watched(
    "transform job",
    "DescribeTransformJob",
    "TransformJobName",
    "TransformJobStatus",
    frozenset({"Completed"}),
    frozenset({"Failed", "Stopped"}),
    "/aws/sagemaker/TransformJobs",
    "{name}/",
)
ENDPOINT = Watched(
    "endpoint",
    "DescribeEndpoint",
    "EndpointName",
    "EndpointStatus",
    frozenset({"InService"}),
    frozenset({"Failed", "OutOfService"}),
    "/aws/sagemaker/Endpoints/{name}",
    "",
)


def clients(region: str | None, profile: str | None) -> tuple[Any, Any]:
    """SageMaker and CloudWatch Logs clients from the usual credential chain."""
    session = boto3.session.Session(profile_name=profile, region_name=region)
    return session.client("sagemaker"), session.client("logs")


def call(client: Any, operation: str, request: dict[str, Any]) -> dict[str, Any]:
    """Send one request, e.g. call(sm, "CreateTrainingJob", {...})."""
    response: dict[str, Any] = getattr(client, xform_name(operation))(**request)
    return response


class LogTail:
    """Prints the new events of every log stream under a prefix, each event once."""

    def __init__(self, logs: Any, group: str, prefix: str, out: Callable[[str], None]):
        self._logs, self._group, self._prefix, self._out = logs, group, prefix, out
        self._tokens: dict[str, str] = {}

    def _streams(self) -> list[str]:
        query = {"logGroupName": self._group}
        if self._prefix:
            query["logStreamNamePrefix"] = self._prefix
        try:
            pages = self._logs.get_paginator("describe_log_streams").paginate(**query)
            return [s["logStreamName"] for page in pages for s in page.get("logStreams", [])]
        except ClientError as error:
            if error.response["Error"]["Code"] == "ResourceNotFoundException":
                return []  # no instance has written yet
            raise

    def poll(self) -> None:
        for stream in self._streams():
            label = stream[len(self._prefix) :]
            while True:
                query = {
                    "logGroupName": self._group,
                    "logStreamName": stream,
                    "startFromHead": True,
                }
                token = self._tokens.get(stream)
                if token:
                    query["nextToken"] = token
                page = self._logs.get_log_events(**query)
                for event in page["events"]:
                    self._out(f"[{label}] {event['message'].rstrip()}")
                if not page["events"] or page["nextForwardToken"] == token:
                    self._tokens[stream] = page["nextForwardToken"]
                    break  # the stream's end, for now
                self._tokens[stream] = page["nextForwardToken"]


def follow(
    client: Any,
    logs: Any | None,
    watched: Watched,
    name: str,
    *,
    timeout_seconds: float,
    poll_seconds: float = 20.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    out: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Poll until `name` settles; return its last description. Raise FollowTimeout at the deadline."""
    tail = (
        LogTail(
            logs, watched.log_group.format(name=name), watched.stream_prefix.format(name=name), out
        )
        if logs is not None
        else None
    )
    deadline = clock() + timeout_seconds
    shown = ""
    while True:
        description = call(client, watched.describe, {watched.name_key: name})
        status = description[watched.status_key]
        line = " / ".join(filter(None, [status, description.get("SecondaryStatus", "")]))
        if line != shown:
            out(f"{watched.kind} {name}: {line}")
            shown = line
        if tail is not None:
            tail.poll()
        if watched.settled(status):
            return description
        if clock() >= deadline:
            raise FollowTimeout(
                f"stopped following {watched.kind} {name} after {timeout_seconds:.0f} s: it is "
                f"still {status} and keeps running on SageMaker; follow it again with --wait "
                "and a larger --wait-timeout, or see the SageMaker console"
            )
        sleep(max(0.0, min(poll_seconds, deadline - clock())))


def outcome(watched: Watched, description: dict[str, Any]) -> tuple[bool, str]:
    """(succeeded, one line for the operator) for a settled resource."""
    name, status = description[watched.name_key], description[watched.status_key]
    if status in watched.succeeded:
        artifact = description.get("ModelArtifacts", {}).get("S3ModelArtifacts")
        return True, f"{watched.kind} {name} {status}" + (
            f": model at {artifact}" if artifact else ""
        )
    reason = description.get("FailureReason", "no reason given")
    return False, f"{watched.kind} {name} {status}: {reason}"
