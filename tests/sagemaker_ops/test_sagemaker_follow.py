"""Sending a training job and following its status and logs, through botocore's Stubber."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sagemaker_testing import IMAGE, ROLE

from sagemaker_ops import aws, cli
from sagemaker_ops import builders as b

NOW = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
GROUP = "/aws/sagemaker/TrainingJobs"
ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-job/job-1"


def description(status: str, secondary: str, **extra) -> dict:
    return {
        "TrainingJobName": "job-1",
        "TrainingJobArn": ARN,
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "CreationTime": NOW,
        "ModelArtifacts": {"S3ModelArtifacts": "s3://my-bucket/o/job-1/output/model.tar.gz"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        **extra,
    }


def expect_streams(logs_stub, streams: list[str] | None) -> None:
    if streams is None:
        logs_stub.add_client_error(
            "describe_log_streams",
            "ResourceNotFoundException",
            "The specified log group does not exist.",
        )
        return
    logs_stub.add_response(
        "describe_log_streams",
        {"logStreams": [{"logStreamName": s} for s in streams]},
        {"logGroupName": GROUP, "logStreamNamePrefix": "job-1/"},
    )


def expect_events(
    logs_stub, stream: str, token: str | None, messages: list[str], next_token: str
) -> None:
    query = {"logGroupName": GROUP, "logStreamName": stream, "startFromHead": True}
    if token:
        query["nextToken"] = token
    logs_stub.add_response(
        "get_log_events",
        {
            "events": [{"timestamp": i, "message": m} for i, m in enumerate(messages)],
            "nextForwardToken": next_token,
        },
        query,
    )


class FakeTime:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def follow_job_1(sagemaker, logs, time: FakeTime, timeout_seconds: float, out) -> dict:
    """`aws.follow` of training job job-1, polling every 30 s on `time`'s clock."""
    return aws.follow(
        sagemaker,
        logs,
        aws.TRAINING_JOB,
        "job-1",
        timeout_seconds=timeout_seconds,
        poll_seconds=30,
        sleep=time.sleep,
        clock=time.clock,
        out=out,
    )


def test_follow_prints_status_changes_and_each_log_line_once(stubbed):
    sagemaker, logs, sm_stub, logs_stub = stubbed
    name = {"TrainingJobName": "job-1"}
    # Poll 1: starting, no log group yet.
    sm_stub.add_response("describe_training_job", description("InProgress", "Starting"), name)
    expect_streams(logs_stub, None)
    # Poll 2: training; two hosts have written.
    sm_stub.add_response("describe_training_job", description("InProgress", "Training"), name)
    expect_streams(logs_stub, ["job-1/algo-1-1700000000", "job-1/algo-2-1700000000"])
    expect_events(
        logs_stub,
        "job-1/algo-1-1700000000",
        None,
        ["[1,0]<stdout>:METRICS epoch=1 loss=0.5\n"],
        "a/1",
    )
    expect_events(logs_stub, "job-1/algo-1-1700000000", "a/1", [], "a/1")
    expect_events(logs_stub, "job-1/algo-2-1700000000", None, [], "b/0")
    # Poll 3: same status (not printed again); only the new line of algo-1 is printed.
    sm_stub.add_response("describe_training_job", description("InProgress", "Training"), name)
    expect_streams(logs_stub, ["job-1/algo-1-1700000000", "job-1/algo-2-1700000000"])
    expect_events(
        logs_stub,
        "job-1/algo-1-1700000000",
        "a/1",
        ["[1,0]<stdout>:METRICS epoch=2 loss=0.25"],
        "a/2",
    )
    expect_events(logs_stub, "job-1/algo-1-1700000000", "a/2", [], "a/2")
    expect_events(logs_stub, "job-1/algo-2-1700000000", "b/0", [], "b/0")
    # Poll 4: done.
    sm_stub.add_response("describe_training_job", description("Completed", "Completed"), name)
    expect_streams(logs_stub, ["job-1/algo-1-1700000000"])
    expect_events(logs_stub, "job-1/algo-1-1700000000", "a/2", [], "a/2")

    lines, time = [], FakeTime()
    final = follow_job_1(sagemaker, logs, time, 3600, lines.append)
    assert final["TrainingJobStatus"] == "Completed"
    assert lines == [
        "training job job-1: InProgress / Starting",
        "training job job-1: InProgress / Training",
        "[algo-1-1700000000] [1,0]<stdout>:METRICS epoch=1 loss=0.5",
        "[algo-1-1700000000] [1,0]<stdout>:METRICS epoch=2 loss=0.25",
        "training job job-1: Completed / Completed",
    ]
    assert time.sleeps == [30, 30, 30]
    assert aws.outcome(aws.TRAINING_JOB, final) == (
        True,
        "training job job-1 Completed: model at s3://my-bucket/o/job-1/output/model.tar.gz",
    )


def test_follow_gives_up_at_its_deadline_and_says_the_job_keeps_running(stubbed):
    sagemaker, _, sm_stub, _ = stubbed
    for _ in range(3):
        sm_stub.add_response(
            "describe_training_job",
            description("InProgress", "Training"),
            {"TrainingJobName": "job-1"},
        )
    time = FakeTime()
    with pytest.raises(
        aws.FollowTimeout, match="after 50 s: it is still InProgress and keeps running on SageMaker"
    ):
        follow_job_1(sagemaker, None, time, 50, lambda _: None)
    assert time.sleeps == [30, 20]  # never sleeps past the deadline


TRAIN = [
    "train",
    "--image",
    IMAGE,
    "--role",
    ROLE,
    "--output-path",
    "s3://my-bucket/o",
    "--job-name",
    "job-1",
    "--channel",
    "train=s3://my-bucket/t/",
    "--hp",
    "epochs=2",
]


def test_cli_train_sends_the_built_request_and_reports_a_failure(capsys, stubbed):
    sagemaker, logs, sm_stub, logs_stub = stubbed
    request = b.training_job_request(
        b.TrainingJob(
            name="job-1",
            image=IMAGE,
            role_arn=ROLE,
            output_path="s3://my-bucket/o",
            channels=(b.TrainingChannel("train", "s3://my-bucket/t/"),),
            hyperparameters={"epochs": "2"},
        )
    )
    sm_stub.add_response("create_training_job", {"TrainingJobArn": ARN}, request)
    sm_stub.add_response(
        "describe_training_job",
        description(
            "Failed", "Failed", FailureReason="hyperparameter epochs=... (from the container)"
        ),
        {"TrainingJobName": "job-1"},
    )
    expect_streams(logs_stub, [])
    code = cli.main(TRAIN + ["--wait"], make_clients=lambda: (sagemaker, logs))
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out == [
        f"CreateTrainingJob: {ARN}",
        "training job job-1: Failed / Failed",
        "training job job-1 Failed: hyperparameter epochs=... (from the container)",
    ]


def test_cli_reports_aws_refusals(capsys, stubbed):
    sagemaker, logs, sm_stub, _ = stubbed
    sm_stub.add_client_error(
        "create_training_job",
        "ResourceLimitExceeded",
        "The account-level service limit 'ml.p3.16xlarge' is 0",
    )
    assert cli.main(TRAIN, make_clients=lambda: (sagemaker, logs)) == 1
    assert "ResourceLimitExceeded" in capsys.readouterr().err
