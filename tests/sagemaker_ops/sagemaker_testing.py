"""Constants and checks shared by the SageMaker tooling tests (not a test module itself)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import boto3
import botocore.session
import botocore.validate

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `scripts` is a folder of tools, not an installed package

from sagemaker_ops import cli, schema  # noqa: E402

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/horovod-keras:1.0"
ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"


def botocore_accepts(operation: str, request: dict) -> None:
    """The check botocore runs before sending, straight from its model, then the strict one."""
    shape = (
        botocore.session.get_session()
        .get_service_model("sagemaker")
        .operation_model(operation)
        .input_shape
    )
    report = botocore.validate.ParamValidator().validate(request, shape)
    assert not report.has_errors(), report.generate_report()
    assert schema.problems(operation, request) == []


def offline_client(service: str):
    """A client with fake credentials and an endpoint on a closed local port: wrap it in a
    Stubber; should anything slip past the stub, it fails on 127.0.0.1:9, never on AWS."""
    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )
    return session.client(service, endpoint_url="http://127.0.0.1:9")


def dry_run(capsys, no_clients, argv: list[str]) -> list[dict]:
    """`sagemaker-ops ARGV --dry-run`, which must succeed without making a client: the steps it
    printed, every request already checked against botocore's model and the strict schema, so
    that no test of the command line passes on a request SageMaker would refuse."""
    assert cli.main([*argv, "--dry-run"], make_clients=no_clients) == 0
    steps = json.loads(capsys.readouterr().out)
    for step in steps:
        botocore_accepts(step["operation"], step["request"])
    return steps
