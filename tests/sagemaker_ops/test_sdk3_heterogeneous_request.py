"""The CreateTrainingJob request SDK 3's ModelTrainer sends for a heterogeneous job
(docs/sagemaker.md, "Heterogeneous clusters"), transcribed from sagemaker-train 1.27.0, the
version constraints-sdk3.txt pins (model_trainer.py `_create_training_job_args`: the user's
channels, then its own `code` and `sm_drivers` channels, their instance groups from
`_resolve_managed_channel_instance_groups`; `Compute._to_resource_config` in sagemaker-core).

Each request is checked against botocore's schema (sagemaker_ops.schema) and against a rule
the service enforces that no schema states: the channels of a job name instance groups
(S3DataSource.InstanceGroupNames) all or none, else "Some channels have assigned instance
groups: [...] while others not: [...]" (aws/sagemaker-python-sdk#5225, #6089)."""

from __future__ import annotations

from sagemaker_testing import IMAGE, ROLE, botocore_accepts

from sagemaker_ops import schema

GROUPS = [
    {"InstanceGroupName": "train", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
    {"InstanceGroupName": "data", "InstanceType": "ml.c5.18xlarge", "InstanceCount": 4},
]
ALL_GROUPS = ["train", "data"]
# SDK 3's constants.py: with source_code= the container runs the SDK's sm_train.sh.
SM_TRAIN = (
    "chmod +x /opt/ml/input/data/sm_drivers/sm_train.sh "
    "&& /opt/ml/input/data/sm_drivers/sm_train.sh"
)


def channel(name: str, uri: str, groups: list[str] | None) -> dict:
    """A channel as ModelTrainer.create_input_data_channel makes it (S3Prefix,
    FullyReplicated, File); InstanceGroupNames only when given."""
    source = {
        "S3DataType": "S3Prefix",
        "S3Uri": uri,
        "S3DataDistributionType": "FullyReplicated",
        **({"InstanceGroupNames": groups} if groups is not None else {}),
    }
    return {"ChannelName": name, "DataSource": {"S3DataSource": source}, "InputMode": "File"}


def sdk3_request(train_groups: list[str] | None, sdk_groups: list[str] | None) -> dict:
    """`ModelTrainer(training_image=IMAGE, source_code=SourceCode(source_dir=..., command="exec
    train"), compute=Compute(instance_groups=[train, data]), hyperparameters={
    "sagemaker_distribution_instance_groups": "train"}).train(input_data_config=[train])`:
    the user's `train` channel naming `train_groups`, the SDK's own naming `sdk_groups`."""
    prefix = "s3://my-bucket/job/job-2026-12-07-00-00-00-000/input"
    return {
        "TrainingJobName": "job-2026-12-07-00-00-00-000",
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingImage": IMAGE,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["/bin/bash"],
            "ContainerArguments": ["-c", SM_TRAIN],
        },
        "HyperParameters": {"sagemaker_distribution_instance_groups": "train"},
        "InputDataConfig": [
            channel("train", "s3://my-bucket/digits/train/", train_groups),
            channel("code", f"{prefix}/code", sdk_groups),
            channel("sm_drivers", f"{prefix}/sm_drivers", sdk_groups),
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://my-bucket/job"},
        "ResourceConfig": {"InstanceGroups": GROUPS, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
    }


def instance_group_problem(request: dict) -> str | None:
    """The service's own refusal of channels that name instance groups, or None: all or none
    of them must, and only groups of the job's ResourceConfig."""
    named = {
        c["ChannelName"]: c["DataSource"]["S3DataSource"].get("InstanceGroupNames")
        for c in request["InputDataConfig"]
    }
    assigned = [name for name, groups in named.items() if groups]
    others = [name for name, groups in named.items() if not groups]
    if assigned and others:
        return (
            f"Some channels have assigned instance groups: [{', '.join(assigned)}] while "
            f"others not: [{', '.join(others)}]"
        )
    known = {group["InstanceGroupName"] for group in request["ResourceConfig"]["InstanceGroups"]}
    unknown = sorted({g for groups in named.values() for g in groups or ()} - known)
    return f"unknown instance groups: {unknown}" if unknown else None


def test_what_the_docs_show_no_channel_naming_groups_is_accepted():
    """Every SDK 3 release: no channel names groups, so every host gets every channel (the
    built-in trainer's data hosts need the train channel whole anyway)."""
    request = sdk3_request(train_groups=None, sdk_groups=None)
    botocore_accepts("CreateTrainingJob", request)
    assert instance_group_problem(request) is None


def test_a_channel_naming_groups_is_accepted_once_the_sdk_names_them_on_its_own_channels():
    """sagemaker-train 1.21 and later: a user channel naming groups makes the SDK name every
    group of Compute on `code` and `sm_drivers` (the code must reach every host)."""
    request = sdk3_request(train_groups=["train"], sdk_groups=ALL_GROUPS)
    botocore_accepts("CreateTrainingJob", request)
    assert instance_group_problem(request) is None


def test_the_request_of_older_sdk3_releases_passes_the_schema_and_is_refused_by_the_service():
    """Before that fix the SDK's own channels named no group: botocore's schema lets the
    request through, and CreateTrainingJob refuses it (the error of #5225 and #6089)."""
    request = sdk3_request(train_groups=["train"], sdk_groups=None)
    botocore_accepts("CreateTrainingJob", request)
    assert instance_group_problem(request) == (
        "Some channels have assigned instance groups: [train] while others not: [code, sm_drivers]"
    )


def test_the_schema_bounds_the_instance_group_names_of_a_channel():
    """Five at most, which botocore's own validator does not check (the strict one does)."""
    groups = ["train", "data", "a", "b", "c", "d"]
    problems = schema.problems("CreateTrainingJob", sdk3_request(groups, groups))
    assert (
        "InputDataConfig[0].DataSource.S3DataSource.InstanceGroupNames: has 6 entries; at "
        "most 5 allowed" in problems
    ), problems
