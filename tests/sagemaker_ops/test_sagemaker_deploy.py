"""Model, endpoint config, endpoint and batch transform requests; the deploy path through a Stubber."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sagemaker_testing import IMAGE, ROLE, botocore_accepts, dry_run

from job.errors import ConfigError
from sagemaker_ops import builders as b
from sagemaker_ops import cli

ARTIFACT = "s3://my-bucket/output/job-1/output/model.tar.gz"
NOW = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def describe_job(status: str = "Completed", name: str = "job-1") -> dict:
    """A DescribeTrainingJob answer with every member its output shape requires."""
    return {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
        "TrainingJobStatus": status,
        "SecondaryStatus": status,
        "ModelArtifacts": {"S3ModelArtifacts": ARTIFACT},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": NOW,
    }


@pytest.mark.parametrize(
    "model",
    [
        b.Model("m-1", IMAGE, ARTIFACT, ROLE),
        b.Model(
            "m-2",
            IMAGE,
            ARTIFACT,
            ROLE,
            environment={"SAGEMAKER_MODEL_SERVER_WORKERS": "1"},
            vpc=b.Vpc(("subnet-1",), ("sg-1",)),
        ),
    ],
)
def test_model_requests_fit_the_schema(model):
    request = b.model_request(model)
    botocore_accepts("CreateModel", request)
    assert request["PrimaryContainer"]["ModelDataUrl"] == ARTIFACT
    assert request["PrimaryContainer"]["Image"] == IMAGE


@pytest.mark.parametrize(
    "endpoint",
    [
        b.Endpoint("ep-1", "m-1"),
        b.Endpoint("ep-2", "m-1", instance_type="ml.g4dn.xlarge", instance_count=3),
    ],
)
def test_endpoint_requests_fit_the_schema(endpoint):
    config = b.endpoint_config_request(endpoint)
    botocore_accepts("CreateEndpointConfig", config)
    botocore_accepts("CreateEndpoint", b.endpoint_request(endpoint))
    assert config["ProductionVariants"][0]["InitialInstanceCount"] == endpoint.instance_count


@pytest.mark.parametrize(
    "options, split, assemble",
    [
        (dict(content_type="text/csv"), "Line", "Line"),
        (
            dict(content_type="application/jsonlines", accept="application/jsonlines"),
            "Line",
            "Line",
        ),
        (dict(content_type="application/json", batch_strategy="SingleRecord"), "None", "None"),
        (
            dict(
                content_type="application/x-npy",
                accept="application/json",
                instance_count=2,
                max_payload_mb=100,
                max_concurrent_transforms=4,
            ),
            "None",
            "None",
        ),
        (dict(content_type="text/csv", accept="application/json"), "Line", "None"),
    ],
)
def test_transform_requests_fit_the_schema(options, split, assemble):
    request = b.transform_job_request(
        b.TransformJob("t-1", "m-1", "s3://my-bucket/in/", "s3://my-bucket/out/", **options)
    )
    botocore_accepts("CreateTransformJob", request)
    assert request["TransformInput"]["SplitType"] == split
    assert request["TransformOutput"]["AssembleWith"] == assemble
    assert request["TransformOutput"]["Accept"] == options.get("accept", options["content_type"])


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: b.Model("m", IMAGE, "model.tar.gz", ROLE),
            "model data 'model.tar.gz' is not an S3 URI",
        ),
        (
            lambda: b.model_request(b.Model("m_1", IMAGE, ARTIFACT, ROLE)),
            "ModelName: 'm_1' does not match",
        ),
        (lambda: b.Endpoint("ep", "m", instance_count=0), "endpoint instance count must be"),
        (
            lambda: b.endpoint_config_request(b.Endpoint("ep", "m", instance_type="ml.m5.huge")),
            "InstanceType: 'ml.m5.huge' is not valid",
        ),
        (
            lambda: b.TransformJob(
                "t",
                "m",
                "s3://my-bucket/in",
                "s3://my-bucket/o",
                content_type="application/x-npy",
                split_type="Line",
            ),
            "split type Line cuts application/x-npy bodies apart",
        ),
        (
            lambda: b.TransformJob(
                "t", "m", "s3://my-bucket/in", "s3://my-bucket/o", content_type="application/xml"
            ),
            "transform content type 'application/xml' is not supported",
        ),
        (
            lambda: b.TransformJob(
                "t", "m", "s3://my-bucket/in", "s3://my-bucket/o", accept="image/png"
            ),
            "transform accept type 'image/png' is not supported",
        ),
        (
            lambda: b.TransformJob(
                "t", "m", "s3://my-bucket/in", "s3://my-bucket/o", max_payload_mb=101
            ),
            "max payload must be 1-100 MB",
        ),
        (
            lambda: b.TransformJob(
                "t", "m", "s3://my-bucket/in", "s3://my-bucket/o", instance_count=0
            ),
            "transform instance count must be",
        ),
        (
            lambda: b.transform_job_request(
                b.TransformJob(
                    "t", "m", "s3://my-bucket/in", "s3://my-bucket/o", instance_type="ml.t2.medium"
                )
            ),
            "TransformResources.InstanceType: 'ml.t2.medium' is not valid",
        ),
        (
            lambda: b.model_artifact(describe_job("InProgress")),
            "training job job-1 is InProgress, not Completed",
        ),
    ],
)
def test_refused_with_a_message_saying_what_to_change(make, message):
    with pytest.raises(ConfigError) as refused:
        make()
    assert message in str(refused.value)


def test_model_artifact_of_a_completed_job():
    assert b.model_artifact(describe_job()) == ARTIFACT


DEPLOY = [
    "deploy",
    "--image",
    IMAGE,
    "--role",
    ROLE,
    "--endpoint-name",
    "ep-1",
    "--instance-type",
    "ml.c5.xlarge",
    "--instance-count",
    "2",
]


def test_cli_deploy_dry_run_with_explicit_artifact(capsys, no_clients):
    steps = dry_run(capsys, no_clients, DEPLOY + ["--model-data", ARTIFACT])
    assert [s["operation"] for s in steps] == [
        "CreateModel",
        "CreateEndpointConfig",
        "CreateEndpoint",
    ]
    model, config, endpoint = (s["request"] for s in steps)
    assert model["ModelName"] == config["ProductionVariants"][0]["ModelName"] == "ep-1"
    assert endpoint == {"EndpointName": "ep-1", "EndpointConfigName": "ep-1"}


def test_cli_deploy_from_training_job_sends_in_order_and_waits(capsys, stubbed):
    sagemaker, logs, sm_stub, logs_stub = stubbed
    sm_stub.add_response("describe_training_job", describe_job(), {"TrainingJobName": "job-1"})
    model = b.model_request(b.Model("ep-1", IMAGE, ARTIFACT, ROLE))
    endpoint = b.Endpoint("ep-1", "ep-1", "ml.c5.xlarge", 2)
    for operation, request, answer in [
        (
            "create_model",
            model,
            {"ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/ep-1"},
        ),
        (
            "create_endpoint_config",
            b.endpoint_config_request(endpoint),
            {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/ep-1"},
        ),
        (
            "create_endpoint",
            b.endpoint_request(endpoint),
            {"EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/ep-1"},
        ),
    ]:
        sm_stub.add_response(operation, answer, request)
    sm_stub.add_response(
        "describe_endpoint",
        {
            "EndpointName": "ep-1",
            "EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/ep-1",
            "EndpointStatus": "InService",
            "CreationTime": NOW,
            "LastModifiedTime": NOW,
        },
        {"EndpointName": "ep-1"},
    )
    logs_stub.add_response(
        "describe_log_streams",
        {"logStreams": [{"logStreamName": "AllTraffic/i-0abc"}]},
        {"logGroupName": "/aws/sagemaker/Endpoints/ep-1"},
    )
    logs_stub.add_response(
        "get_log_events",
        {
            "events": [{"timestamp": 1, "message": "serve: model loaded, listening on 8080\n"}],
            "nextForwardToken": "f/1",
        },
        {
            "logGroupName": "/aws/sagemaker/Endpoints/ep-1",
            "logStreamName": "AllTraffic/i-0abc",
            "startFromHead": True,
        },
    )
    logs_stub.add_response(
        "get_log_events",
        {"events": [], "nextForwardToken": "f/1"},
        {
            "logGroupName": "/aws/sagemaker/Endpoints/ep-1",
            "logStreamName": "AllTraffic/i-0abc",
            "startFromHead": True,
            "nextToken": "f/1",
        },
    )
    code = cli.main(
        DEPLOY + ["--training-job", "job-1", "--wait"], make_clients=lambda: (sagemaker, logs)
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines() == [
        "CreateModel: arn:aws:sagemaker:us-east-1:123456789012:model/ep-1",
        "CreateEndpointConfig: arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/ep-1",
        "CreateEndpoint: arn:aws:sagemaker:us-east-1:123456789012:endpoint/ep-1",
        "endpoint ep-1: InService",
        "[AllTraffic/i-0abc] serve: model loaded, listening on 8080",
        "endpoint ep-1 InService",
    ]


def test_cli_deploy_refuses_an_unfinished_job_before_creating_anything(capsys, stubbed):
    sagemaker, logs, sm_stub, _ = stubbed
    sm_stub.add_response(
        "describe_training_job", describe_job("InProgress"), {"TrainingJobName": "job-1"}
    )
    code = cli.main(DEPLOY + ["--training-job", "job-1"], make_clients=lambda: (sagemaker, logs))
    assert code == 2
    assert "training job job-1 is InProgress, not Completed" in capsys.readouterr().err


def test_cli_transform_creates_the_model_then_the_job(capsys, no_clients):
    steps = dry_run(
        capsys,
        no_clients,
        [
            "transform",
            "--image",
            IMAGE,
            "--role",
            ROLE,
            "--model-data",
            ARTIFACT,
            "--job-name",
            "t-1",
            "--input",
            "s3://my-bucket/batch/",
            "--output-path",
            "s3://my-bucket/predictions/",
            "--content-type",
            "application/jsonlines",
        ],
    )
    assert [s["operation"] for s in steps] == ["CreateModel", "CreateTransformJob"]
    assert steps[1]["request"]["ModelName"] == steps[0]["request"]["ModelName"] == "t-1"


def test_cli_transform_with_an_existing_model(capsys, no_clients):
    [step] = dry_run(
        capsys,
        no_clients,
        [
            "transform",
            "--model-name",
            "m-1",
            "--job-name",
            "t-2",
            "--input",
            "s3://my-bucket/batch/",
            "--output-path",
            "s3://my-bucket/p/",
            "--content-type",
            "application/x-npy",
        ],
    )
    assert step["operation"] == "CreateTransformJob"
    assert step["request"]["ModelName"] == "m-1"
    assert step["request"]["TransformInput"]["SplitType"] == "None"


def test_cli_transform_without_a_model_is_refused(capsys, no_clients):
    assert (
        cli.main(
            [
                "transform",
                "--input",
                "s3://my-bucket/b/",
                "--output-path",
                "s3://my-bucket/p/",
                "--dry-run",
            ],
            make_clients=no_clients,
        )
        == 2
    )
    assert "name the model" in capsys.readouterr().err
