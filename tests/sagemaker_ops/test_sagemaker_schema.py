"""The strict schema check: what botocore's own validator lets through, this refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import botocore.session
import botocore.validate
import pytest

from job.errors import ConfigError
from sagemaker_ops import schema

ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"


def minimal(**changes) -> dict:
    request = {
        "TrainingJobName": "job-1",
        "RoleArn": ROLE,
        "OutputDataConfig": {"S3OutputPath": "s3://my-bucket/o"},
        "AlgorithmSpecification": {"TrainingImage": "image", "TrainingInputMode": "File"},
        "ResourceConfig": {
            "InstanceType": "ml.m5.xlarge",
            "InstanceCount": 1,
            "VolumeSizeInGB": 30,
        },
    }
    request.update(changes)
    return request


def botocore_alone_accepts(request: dict) -> bool:
    report = botocore.validate.ParamValidator().validate(
        request, schema.input_shape("CreateTrainingJob")
    )
    return not report.has_errors()


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"TrainingJobName": "job_1"}, "TrainingJobName: 'job_1' does not match the pattern"),
        ({"TrainingJobName": "j" * 64}, "TrainingJobName: 64 characters; at most 63 allowed"),
        (
            {"ResourceConfig": {"InstanceType": "ml.m5.xxl", "InstanceCount": 1}},
            "ResourceConfig.InstanceType: 'ml.m5.xxl' is not valid",
        ),
        (
            {"AlgorithmSpecification": {"TrainingImage": "i", "TrainingInputMode": "Stream"}},
            "AlgorithmSpecification.TrainingInputMode: 'Stream' is not valid; choose one of Pipe, "
            "File, FastFile",
        ),
        (
            {"Tags": [{"Key": "k", "Value": "bell\x07"}]},
            "Tags[0].Value: 'bell\\x07' does not match",
        ),
        (
            {"HyperParameters": {f"k{i}": "v" for i in range(101)}},
            "HyperParameters: has 101 entries; at most 100 allowed",
        ),
        (
            {"StoppingCondition": {"MaxPendingTimeInSeconds": 2419201}},
            "StoppingCondition.MaxPendingTimeInSeconds: 2419201 is above the maximum 2419200",
        ),
    ],
)
def test_refuses_what_botocore_alone_lets_through(changes, problem):
    request = minimal(**changes)
    assert botocore_alone_accepts(request)
    assert any(problem in line for line in schema.problems("CreateTrainingJob", request))


def test_reports_botocores_own_findings_and_all_problems_at_once():
    request = minimal(TrainingJobName="job_1", RoleArn="short")
    del request["OutputDataConfig"]
    with pytest.raises(ConfigError) as refused:
        schema.validate("CreateTrainingJob", request)
    message = str(refused.value)
    assert 'Missing required parameter in input: "OutputDataConfig"' in message
    assert "RoleArn, value: 5, valid min length: 20" in message
    assert "TrainingJobName: 'job_1' does not match" in message


def test_a_list_where_a_map_belongs_is_a_problem_not_a_crash():
    """Environment is a map; a list in its place is botocore's finding, reported like any
    other (the strict walk used to call .items() on it: AttributeError)."""
    with pytest.raises(ConfigError) as refused:
        schema.validate("CreateTrainingJob", minimal(Environment=["EPOCHS=3"]))
    assert "Environment" in str(refused.value)


def test_unicode_classes_accept_text_and_refuse_control_characters():
    shape_pattern = (
        schema.input_shape("CreateAlgorithm").members["AlgorithmDescription"].metadata["pattern"]
    )
    assert "\\p{L}" in shape_pattern
    request = {
        "AlgorithmName": "a",
        "TrainingSpecification": {
            "TrainingImage": "i",
            "SupportedTrainingInstanceTypes": ["ml.m5.xlarge"],
            "TrainingChannels": [
                {
                    "Name": "train",
                    "SupportedContentTypes": ["text/csv"],
                    "SupportedInputModes": ["File"],
                }
            ],
        },
    }
    assert (
        schema.problems(
            "CreateAlgorithm",
            {**request, "AlgorithmDescription": "Entraîne à 95 % — «vite» (x≥1) ✓"},
        )
        == []
    )
    assert schema.problems("CreateAlgorithm", {**request, "AlgorithmDescription": "a\tb"}) == [
        "AlgorithmDescription: 'a\\tb' does not match the pattern "
        "[\\p{L}\\p{M}\\p{Z}\\p{S}\\p{N}\\p{P}]*"
    ]


def test_enum_comes_from_botocore():
    assert "ml.p4d.24xlarge" in schema.enum("TrainingInstanceType")
    assert schema.enum("TrainingInputMode") == ("Pipe", "File", "FastFile")


def test_the_operator_tool_is_an_installed_command():
    """`pip install .` (make setup) puts `sagemaker-ops` next to the interpreter; its dry run
    refuses an incomplete job with exit 2 and the option to add, sending nothing."""
    command = Path(sys.executable).with_name("sagemaker-ops")
    listed = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0
    assert "{train,register,deploy,transform}" in listed.stdout
    refused = subprocess.run(
        [str(command), "train", "--dry-run"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2, refused.stderr
    assert "sagemaker-ops train: error:" in refused.stderr
