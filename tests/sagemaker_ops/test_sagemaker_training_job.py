"""CreateTrainingJob: option combinations fit botocore's schema; bad input is refused unsent."""

from __future__ import annotations

import json

import pytest
from sagemaker_testing import IMAGE, ROLE, botocore_accepts, dry_run

from job.errors import ConfigError
from sagemaker_ops import builders as b
from sagemaker_ops import cli, metrics, schema

TRAIN = b.TrainingChannel("train", "s3://my-bucket/data/train/")


def job(**changes) -> b.TrainingJob:
    fields = dict(
        name="horovod-keras-test",
        image=IMAGE,
        role_arn=ROLE,
        output_path="s3://my-bucket/output",
        channels=(TRAIN,),
    )
    fields.update(changes)
    return b.TrainingJob(**fields)


def test_minimal_job_is_the_expected_request():
    request = b.training_job_request(job())
    assert request == {
        "TrainingJobName": "horovod-keras-test",
        "AlgorithmSpecification": {
            "TrainingImage": IMAGE,
            "TrainingInputMode": "File",
            "MetricDefinitions": metrics.definitions(),
            "EnableSageMakerMetricsTimeSeries": True,
        },
        "RoleArn": ROLE,
        "HyperParameters": {},
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "InputMode": "File",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": "s3://my-bucket/data/train/",
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://my-bucket/output"},
        "ResourceConfig": {
            "InstanceType": "ml.m5.xlarge",
            "InstanceCount": 1,
            "VolumeSizeInGB": 30,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "EnableManagedSpotTraining": False,
    }
    botocore_accepts("CreateTrainingJob", request)


COMBINATIONS = {
    "distributed-gpu-sharded-fastfile-npz": dict(
        instance_type="ml.p3.16xlarge",
        instance_count=4,
        volume_size_gb=200,
        channels=(
            b.TrainingChannel(
                "train", "s3://my-bucket/t/", "ShardedByS3Key", "FastFile", "application/x-npz"
            ),
            b.TrainingChannel(
                "validation",
                "s3://my-bucket/v/",
                "FullyReplicated",
                "FastFile",
                "application/x-npz",
            ),
        ),
        hyperparameters={
            "epochs": 20,
            "global_batch_size": 4096,
            "scale_learning_rate": True,
            "optimizer": "sgd",
            "processes_per_host": 8,
        },
    ),
    "spot-with-checkpoints": dict(
        spot=True,
        max_runtime_seconds=3600,
        max_wait_seconds=7200,
        checkpoint_s3_uri="s3://my-bucket/checkpoints/run-1",
        hyperparameters={"checkpoint_every_epochs": "1", "learning_rate": "0.01"},
    ),
    "vpc-environment-tags": dict(
        vpc=b.Vpc(("subnet-0abc", "subnet-0def"), ("sg-0123",)),
        environment={"NCCL_DEBUG": "WARN", "TF_CPP_MIN_LOG_LEVEL": "2"},
        tags={"project": "horovod-keras", "owner": "ml-team"},
        channels=(b.TrainingChannel("train", "s3://my-bucket/t/", content_type="text/csv"),),
    ),
    "sdk-style-hyperparameters": dict(
        hyperparameters={
            "sagemaker_mpi_num_of_processes_per_host": 2,
            "sagemaker_mpi_custom_mpi_options": "-x NCCL_DEBUG=INFO",
            "sagemaker_region": '"us-east-1"',
            "optimizer": '"sgd"',
        }
    ),
    "script-mode": dict(
        hyperparameters={"sagemaker_program": "my_train.py", "my_own_flag": "yes"},
        channels=(b.TrainingChannel("images", "s3://my-bucket/images/"),),
    ),
    "warm-pool-and-tensorboard": dict(
        keep_alive_seconds=1800, tensorboard_s3_uri="s3://my-bucket/tensorboard/run-1"
    ),
    "script-mode-from-environment": dict(
        environment={"SAGEMAKER_PROGRAM": "my_train.py"},
        channels=(),
        hyperparameters={"anything": 1},
    ),
}


@pytest.mark.parametrize("name", COMBINATIONS)
def test_option_combinations_fit_the_schema(name):
    request = b.training_job_request(job(**COMBINATIONS[name]))
    botocore_accepts("CreateTrainingJob", request)
    assert all(isinstance(v, str) for v in request["HyperParameters"].values())


def test_distributed_spot_details_reach_the_request():
    request = b.training_job_request(job(**COMBINATIONS["distributed-gpu-sharded-fastfile-npz"]))
    assert request["ResourceConfig"]["InstanceCount"] == 4
    assert [
        c["DataSource"]["S3DataSource"]["S3DataDistributionType"]
        for c in request["InputDataConfig"]
    ] == ["ShardedByS3Key", "FullyReplicated"]
    assert request["AlgorithmSpecification"]["TrainingInputMode"] == "FastFile"
    assert request["HyperParameters"] == {
        "epochs": "20",
        "global_batch_size": "4096",
        "scale_learning_rate": "true",
        "optimizer": "sgd",
        "processes_per_host": "8",
    }
    spot = b.training_job_request(job(**COMBINATIONS["spot-with-checkpoints"]))
    assert spot["EnableManagedSpotTraining"] is True
    assert spot["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    assert spot["CheckpointConfig"] == {
        "S3Uri": "s3://my-bucket/checkpoints/run-1",
        "LocalPath": "/opt/ml/checkpoints",
    }
    vpc = b.training_job_request(job(**COMBINATIONS["vpc-environment-tags"]))
    assert vpc["VpcConfig"] == {
        "Subnets": ["subnet-0abc", "subnet-0def"],
        "SecurityGroupIds": ["sg-0123"],
    }
    assert {"Key": "owner", "Value": "ml-team"} in vpc["Tags"]
    assert vpc["InputDataConfig"][0]["ContentType"] == "text/csv"


def test_a_warm_pool_and_live_tensorboard_reach_the_request():
    request = b.training_job_request(job(**COMBINATIONS["warm-pool-and-tensorboard"]))
    assert request["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800
    assert request["TensorBoardOutputConfig"] == {
        "S3OutputPath": "s3://my-bucket/tensorboard/run-1",
        "LocalPath": "/opt/ml/output/tensorboard",
    }  # where the trainer writes its events
    plain = b.training_job_request(job())
    assert "KeepAlivePeriodInSeconds" not in plain["ResourceConfig"]
    assert "TensorBoardOutputConfig" not in plain


REFUSED = {
    "zero instances": (
        dict(instance_count=0),
        "instance count must be a whole number of at least 1",
    ),
    "negative instances": (dict(instance_count=-2), "instance count must be"),
    "unknown channel": (
        dict(channels=(TRAIN, b.TrainingChannel("test", "s3://my-bucket/x/"))),
        "unknown channel 'test': the built-in trainer reads train (required)",
    ),
    "no train channel": (
        dict(channels=(b.TrainingChannel("validation", "s3://my-bucket/v/"),)),
        "missing channel 'train'",
    ),
    "channel twice": (dict(channels=(TRAIN, TRAIN)), "channel(s) given twice: train"),
    "output not s3": (
        dict(output_path="my-bucket/output"),
        "output path 'my-bucket/output' is not an S3 URI",
    ),
    "output https": (dict(output_path="https://my-bucket.s3.amazonaws.com/x"), "is not an S3 URI"),
    "bucket uppercase": (
        dict(checkpoint_s3_uri="s3://My_Bucket/ck"),
        "checkpoint S3 URI 's3://My_Bucket/ck' is not an S3 URI",
    ),
    "spot wait below runtime": (
        dict(spot=True, max_runtime_seconds=7200, max_wait_seconds=3600),
        "max wait 3600 s is less than max runtime 7200 s",
    ),
    "spot without wait": (dict(spot=True), "managed spot training needs a max wait"),
    "wait without spot": (
        dict(max_wait_seconds=90000),
        "max wait applies to managed spot training only",
    ),
    "keep-alive beyond the API's range": (
        dict(keep_alive_seconds=21601),
        "keep-alive 21601 s is outside SageMaker's warm-pool range 0 .. 21600 s",
    ),
    "warm pool with spot": (
        dict(keep_alive_seconds=60, spot=True, max_wait_seconds=90000),
        "a warm pool (keep-alive) cannot be used with managed spot",
    ),
    "tensorboard not s3": (
        dict(tensorboard_s3_uri="/tmp/tb"),
        "TensorBoard S3 URI '/tmp/tb' is not an S3 URI",
    ),
    "runtime beyond 28 days": (dict(max_runtime_seconds=29 * 86400), "above SageMaker's limit"),
    "unknown hyperparameter": (
        dict(hyperparameters={"learning_rte": "0.1"}),
        "unknown hyperparameter(s) learning_rte (did you mean learning_rate",
    ),
    "hyperparameter out of range": (
        dict(hyperparameters={"dropout_rate": 0.95}),
        "hyperparameter dropout_rate='0.95' is invalid",
    ),
    "bad choice": (dict(hyperparameters={"optimizer": "rmsprop"}), "expected one of adam, sgd"),
    "bad launcher value": (
        dict(hyperparameters={"sagemaker_mpi_num_of_processes_per_host": "-1"}),
        "processes_per_host",
    ),
    "bad content type": (
        dict(
            channels=(
                b.TrainingChannel("train", "s3://my-bucket/t/", content_type="application/json"),
            )
        ),
        "content type 'application/json' is not supported; choose one of text/csv, application/x-npz",
    ),
    "unknown instance type": (
        dict(instance_type="ml.p3.2xlarg"),
        "'ml.p3.2xlarg' is not valid; did you mean ml.p3.2xlarge",
    ),
    "bad job name": (dict(name="my_job"), "TrainingJobName: 'my_job' does not match"),
    "bad role": (dict(role_arn="SageMakerRole"), "RoleArn"),
    "environment key": (
        dict(environment={"BAD-KEY": "1"}),
        "Environment key: 'BAD-KEY' does not match",
    ),
    "too many hyperparameters": (
        dict(hyperparameters={"sagemaker_program": "x.py", **{f"k{i}": i for i in range(100)}}),
        "HyperParameters: has 101 entries; at most 100 allowed",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refused_with_a_message_saying_what_to_change(case):
    changes, message = REFUSED[case]
    with pytest.raises(ConfigError) as refused:
        b.training_job_request(job(**changes))
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "channel, message",
    [
        (
            dict(name="train", s3_uri="s3://my-bucket/t", input_mode="Pipe"),
            "input mode 'Pipe' is not supported; choose one of File, FastFile (Pipe streams FIFOs",
        ),
        (
            dict(name="train", s3_uri="s3://my-bucket/t", distribution="ShardedByKey"),
            "distribution 'ShardedByKey' is not supported; choose one of FullyReplicated, ShardedByS3Key",
        ),
        (
            dict(name="train", s3_uri="gs://my-bucket/t"),
            "channel train: 'gs://my-bucket/t' is not an S3 URI",
        ),
        (
            dict(name="train data", s3_uri="s3://my-bucket/t"),
            "channel name 'train data' is invalid",
        ),
    ],
)
def test_channel_refused(channel, message):
    with pytest.raises(ConfigError, match=None) as refused:
        b.TrainingChannel(**channel)
    assert message in str(refused.value)


def test_vpc_needs_both_parts():
    with pytest.raises(ConfigError, match="both subnets and security groups"):
        b.Vpc(("subnet-1",), ())


ARGS = [
    "train",
    "--image",
    IMAGE,
    "--role",
    ROLE,
    "--output-path",
    "s3://my-bucket/out",
    "--job-name",
    "cli-job",
]


def train_request(capsys, no_clients, *options: str) -> dict:
    """The one CreateTrainingJob request that `sagemaker-ops train` with ARGS, the train
    channel and OPTIONS prints with --dry-run."""
    [step] = dry_run(capsys, no_clients, [*ARGS, "--channel", "train=s3://my-bucket/t/", *options])
    assert step["operation"] == "CreateTrainingJob"
    return step["request"]


def test_cli_dry_run_prints_the_request_and_makes_no_client(capsys, no_clients):
    request = train_request(
        capsys,
        no_clients,
        "--channel",
        "validation=s3://my-bucket/v/",
        "--distribution",
        "train=ShardedByS3Key",
        "--input-mode",
        "FastFile",
        "--content-type",
        "text/csv",
        "--instance-count",
        "2",
        "--hp",
        "epochs=3",
        "--spot",
        "--max-runtime",
        "3600",
        "--max-wait",
        "7200",
        "--checkpoint-s3",
        "s3://my-bucket/ck",
        "--subnet",
        "subnet-1",
        "--security-group",
        "sg-1",
        "--env",
        "NCCL_DEBUG=WARN",
    )
    assert [
        (
            c["ChannelName"],
            c["InputMode"],
            c["ContentType"],
            c["DataSource"]["S3DataSource"]["S3DataDistributionType"],
        )
        for c in request["InputDataConfig"]
    ] == [
        ("train", "FastFile", "text/csv", "ShardedByS3Key"),
        ("validation", "FastFile", "text/csv", "FullyReplicated"),
    ]
    assert request["HyperParameters"] == {"epochs": "3"}
    assert request["Environment"] == {"NCCL_DEBUG": "WARN"}


def test_cli_asks_for_a_warm_pool_and_live_tensorboard(capsys, no_clients):
    request = train_request(
        capsys, no_clients, "--keep-alive", "900", "--tensorboard-s3", "s3://my-bucket/tb"
    )
    assert request["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900
    assert request["TensorBoardOutputConfig"]["S3OutputPath"] == "s3://my-bucket/tb"


def test_cli_turns_on_inter_container_traffic_encryption(capsys, no_clients):
    plain = train_request(capsys, no_clients, "--instance-count", "2")
    encrypted = train_request(
        capsys, no_clients, "--instance-count", "2", "--encrypt-inter-container-traffic"
    )
    assert "EnableInterContainerTrafficEncryption" not in plain
    assert encrypted.pop("EnableInterContainerTrafficEncryption") is True
    assert encrypted == plain


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--channel", "train=s3://my-bucket/t/", "--instance-count", "0"], "instance count"),
        (["--channel", "trian=s3://my-bucket/t/"], "unknown channel 'trian'"),
        (
            ["--channel", "train=s3://my-bucket/t/", "--distribution", "valid=ShardedByS3Key"],
            "names channel 'valid', which no --channel gives",
        ),
        (
            ["--channel", "train=s3://my-bucket/t/", "--hp", "epochs"],
            "--hp 'epochs' is not KEY=VALUE",
        ),
        (
            ["--channel", "train=s3://my-bucket/t/", "--spot", "--max-wait", "60"],
            "max wait 60 s is less than max runtime 86400 s",
        ),
    ],
)
def test_cli_refuses_before_any_client_exists(capsys, no_clients, extra, message):
    # Even without --dry-run: the refusal comes before a client could be made.
    assert cli.main(ARGS + extra, make_clients=no_clients) == 2
    error = capsys.readouterr().err
    assert message in error and "nothing was sent" in error


def test_cli_hyperparameters_file_then_flags(tmp_path, capsys, no_clients):
    path = tmp_path / "hp.json"
    path.write_text(json.dumps({"epochs": 5, "fp16_allreduce": True, "optimizer": "sgd"}))
    request = train_request(capsys, no_clients, "--hyperparameters", str(path), "--hp", "epochs=7")
    assert request["HyperParameters"] == {
        "epochs": "7",
        "fp16_allreduce": "true",
        "optimizer": "sgd",
    }


def test_default_job_name_fits_sagemaker():
    from datetime import datetime

    name = b.default_name("x" * 80, datetime(2024, 5, 6, 7, 8, 9))
    assert len(name) == 63 and name.endswith("-20240506-070809")
    assert (
        schema.problems(
            "CreateTrainingJob",
            {
                "TrainingJobName": name,
                "RoleArn": ROLE,
                "OutputDataConfig": {"S3OutputPath": "s3://my-bucket/o"},
            },
        )
        == []
    )


def test_cli_asks_for_a_heterogeneous_cluster_and_names_the_groups_that_train(capsys, no_clients):
    request = train_request(
        capsys,
        no_clients,
        "--hp",
        "program=train.py",
        "--instance-group",
        "train:ml.p4d.24xlarge:2",
        "--instance-group",
        "data:ml.c5.18xlarge:4",
        "--train-groups",
        "train",
    )
    assert request["ResourceConfig"] == {
        "InstanceGroups": [
            {"InstanceGroupName": "train", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
            {"InstanceGroupName": "data", "InstanceType": "ml.c5.18xlarge", "InstanceCount": 4},
        ],
        "VolumeSizeInGB": 30,
    }
    assert request["HyperParameters"]["sagemaker_distribution_instance_groups"] == '["train"]'


GROUPS = (("train", "ml.p4d.24xlarge", 2), ("data", "ml.c5.18xlarge", 4))
SCRIPT = {"sagemaker_program": "train.py"}


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(instance_groups=GROUPS, hyperparameters=SCRIPT),
            "this job has 2 instance groups, train (2 x ml.p4d.24xlarge), data (4 x ml.c5.18xlarge), "
            "and names none to train",
        ),
        (
            dict(
                instance_groups=GROUPS,
                hyperparameters={**SCRIPT, "sagemaker_distribution_instance_groups": '["gpu"]'},
            ),
            "names ['gpu'], which this job does not have",
        ),
        (
            dict(
                instance_groups=GROUPS,
                hyperparameters={"sagemaker_distribution_instance_groups": '["train"]'},
                channels=(b.TrainingChannel("train", "s3://my-bucket/t/", "ShardedByS3Key"),),
            ),
            "the train channel must be FullyReplicated",
        ),
        (dict(instance_groups=GROUPS * 3), "at most 5 groups, each named once"),
        (dict(instance_groups=(("x" * 65, "ml.c5.xlarge", 1),)), "1 to 64 characters"),
        (dict(instance_groups=(("train", "ml.c5.xlarge", 0),)), "instance group train's count"),
    ],
)
def test_instance_groups_that_would_fail_the_job_are_refused_unsent(changes, message):
    with pytest.raises(ConfigError) as refused:
        b.training_job_request(job(**changes))
    assert message in str(refused.value)


def mlflow_dry_run(capsys, no_clients, uri, *more):
    """`sagemaker-ops train ... --mlflow URI MORE... --dry-run`: its exit code and what it printed."""
    arguments = [*ARGS, "--channel", "train=s3://my-bucket/t/", "--mlflow", uri, *more]
    code = cli.main([*arguments, "--dry-run"], make_clients=no_clients)
    return code, capsys.readouterr()


@pytest.mark.parametrize(
    "uri",
    [
        "https://mlflow.example.com",
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team",
    ],
)
def test_cli_logs_the_job_to_mlflow_through_the_environment(capsys, no_clients, uri):
    code, printed = mlflow_dry_run(capsys, no_clients, uri, "--mlflow-experiment", "digits")
    assert code == 0
    [step] = json.loads(printed.out)
    botocore_accepts("CreateTrainingJob", step["request"])
    assert step["request"]["Environment"] == {
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_EXPERIMENT_NAME": "digits",
    }


@pytest.mark.parametrize(
    "uri, message",
    [
        ("mlflow.example.com", "give an http(s):// tracking server"),
        (
            "arn:aws:sagemaker:us-east-1:123:mlflow-tracking-server/team",
            "is not the ARN of a SageMaker managed MLflow server",
        ),
    ],
)
def test_cli_refuses_a_tracking_uri_the_job_could_not_use(capsys, no_clients, uri, message):
    code, printed = mlflow_dry_run(capsys, no_clients, uri)
    assert code == 2
    assert message in printed.err and "nothing was sent" in printed.err


SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:mlflow-token-AbCdEf"


def test_cli_keeps_the_mlflow_token_in_secrets_manager(capsys, no_clients):
    """--mlflow-token-secret: the job's Environment names the secret; nothing to warn of."""
    code, printed = mlflow_dry_run(
        capsys, no_clients, "https://mlflow.example.com", "--mlflow-token-secret", SECRET_ARN
    )
    assert code == 0
    [step] = json.loads(printed.out)
    botocore_accepts("CreateTrainingJob", step["request"])
    assert step["request"]["Environment"] == {
        "MLFLOW_TRACKING_URI": "https://mlflow.example.com",
        "MLFLOW_TRACKING_TOKEN_SECRET_ARN": SECRET_ARN,
    }
    assert printed.err == ""


def test_cli_masks_secrets_in_what_it_prints_and_warns_of_a_token_in_the_environment(
    capsys, no_clients
):
    code, printed = mlflow_dry_run(
        capsys,
        no_clients,
        "http://me:pa55@mlflow.example.com:5000",
        *("--env", "MLFLOW_TRACKING_TOKEN=tok-123"),
        *("--env", "AWS_SECRET_ACCESS_KEY=key-456"),
        *("--env", "EPOCHS=3"),
    )
    assert code == 0
    for secret in ("tok-123", "key-456", "pa55"):
        assert secret not in printed.out and secret not in printed.err
    [step] = json.loads(printed.out)
    assert step["request"]["Environment"] == {
        "MLFLOW_TRACKING_TOKEN": "****",
        "AWS_SECRET_ACCESS_KEY": "****",
        "EPOCHS": "3",
        "MLFLOW_TRACKING_URI": "http://me:****@mlflow.example.com:5000",
    }
    assert (
        "warning: MLFLOW_TRACKING_TOKEN in the job's Environment is shown by DescribeTrainingJob"
        in printed.err
        and "--mlflow-token-secret ARN" in printed.err
    )
    assert "warning: MLflow: credentials go over plain http to mlflow.example.com" in printed.err


def test_what_is_sent_is_not_masked(stubbed):
    sagemaker, logs, sm_stub, _ = stubbed
    plan, _ = cli.train_plan(
        cli.parser().parse_args(
            ARGS + ["--channel", "train=s3://my-bucket/t/", "--env", "MLFLOW_TRACKING_TOKEN=tok-1"]
        ),
        lambda name: {},
    )
    [(_, request)] = plan
    assert request["Environment"] == {"MLFLOW_TRACKING_TOKEN": "tok-1"}
    sm_stub.add_response(
        "create_training_job",
        {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/j"},
        request,
    )
    assert (
        cli.deliver(
            plan,
            None,
            cli.Delivery(),
            cli._Clients(lambda: (sagemaker, logs)),
            out=lambda line: None,
        )
        == 0
    )


def test_cli_refuses_a_token_secret_that_is_no_secret_arn(capsys, no_clients):
    code, printed = mlflow_dry_run(
        capsys, no_clients, "https://mlflow.example.com", "--mlflow-token-secret", "my-token"
    )
    assert code == 2
    assert "is not the ARN of a Secrets Manager secret" in printed.err
