import json
from pathlib import Path

import pytest

from job.errors import ConfigError
from job.hyperparameters import decode, parse
from job.paths import MlPaths
from job.sagemaker_config import (
    Channel,
    InstanceGroup,
    JobConfig,
    ResourceConfig,
    read_job_config,
    write_job_config,
)
from job.trainer_config import TrainerConfig
from tests.conftest import write_json


def config(tmp_path, resource=None, hyperparameters=None, inputdata=None):
    paths = MlPaths(tmp_path)
    if resource is not None:
        write_json(paths.resource_config, resource)
    if hyperparameters is not None:
        write_json(paths.hyperparameters, hyperparameters)
    if inputdata is not None:
        write_json(paths.input_data_config, inputdata)
    return paths


def test_reads_the_documented_example(tmp_path):
    paths = config(
        tmp_path,
        {
            "current_host": "algo-2",
            "hosts": ["algo-2", "algo-1"],
            "network_interface_name": "eth1",
            "current_group_name": "homogeneousCluster",
            "current_instance_type": "ml.p4d.24xlarge",
            "instance_groups": [
                {
                    "instance_group_name": "homogeneousCluster",
                    "instance_type": "ml.p4d.24xlarge",
                    "hosts": ["algo-2", "algo-1"],
                }
            ],
        },
        {"epochs": "3"},
        {
            "train": {
                "ContentType": "text/csv",
                "TrainingInputMode": "FastFile",
                "S3DistributionType": "ShardedByS3Key",
                "RecordWrapperType": "None",
            }
        },
    )
    job = read_job_config(paths)
    assert job.resources.hosts == ("algo-1", "algo-2")
    assert job.resources.current_host == "algo-2"
    assert job.resources.instance_groups == (  # one group: nothing the host list does not say
        InstanceGroup("homogeneousCluster", "ml.p4d.24xlarge", ("algo-1", "algo-2")),
    )
    assert job.resources.network_interface_name == "eth1"
    assert job.resources.instance_type == "ml.p4d.24xlarge"
    assert job.channels["train"].sharded_by_host and job.channels["train"].input_mode == "FastFile"
    assert job.hyperparameters == {"epochs": "3"}


def test_missing_files_mean_a_single_local_host(tmp_path):
    (tmp_path / "input" / "data" / "train").mkdir(parents=True)
    job = read_job_config(MlPaths(tmp_path))
    assert job.resources.hosts == ("algo-1",) and job.resources.current_host == "algo-1"
    assert list(job.channels) == ["train"] and job.hyperparameters == {}


# A heterogeneous job's file, as SageMaker's documentation shows it (hosts in any order).
HETERO = {
    "current_host": "algo-2",
    "current_instance_type": "ml.c5.18xlarge",
    "current_group_name": "data",
    "hosts": ["algo-1", "algo-2", "algo-3"],
    "instance_groups": [
        {"instance_group_name": "train", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-1"]},
        {
            "instance_group_name": "data",
            "instance_type": "ml.c5.18xlarge",
            "hosts": ["algo-3", "algo-2"],
        },
    ],
    "network_interface_name": "eth0",
}


def test_reads_a_heterogeneous_cluster_and_writes_it_back(tmp_path):
    job = read_job_config(config(tmp_path / "read", HETERO))
    resources = job.resources
    assert resources.current_group == "data"
    assert resources.instance_groups == (
        InstanceGroup("train", "ml.p4d.24xlarge", ("algo-1",)),
        InstanceGroup("data", "ml.c5.18xlarge", ("algo-2", "algo-3")),
    )
    assert resources.group("data").describe() == "data (2 x ml.c5.18xlarge)"
    copy = MlPaths(tmp_path / "written")
    write_job_config(JobConfig(copy, resources))
    assert read_job_config(copy).resources == resources


@pytest.mark.parametrize(
    "resource, message",
    [
        ({**HETERO, "current_group_name": "gpu"}, "no instance group 'gpu'"),
        ({**HETERO, "current_group_name": "train"}, "current_host 'algo-2' is not in its group"),
        (
            {**HETERO, "hosts": ["algo-1", "algo-2", "algo-3", "algo-4"]},
            "the hosts of `instance_groups`",
        ),
        (
            {
                **HETERO,
                "instance_groups": [
                    *HETERO["instance_groups"],
                    {"instance_group_name": "data", "hosts": ["algo-4"]},
                ],
                "hosts": ["algo-1", "algo-2", "algo-3", "algo-4"],
            },
            "each named once",
        ),
        ({**HETERO, "instance_groups": "train"}, "`instance_groups` must be a list"),
        (
            {
                **HETERO,
                "instance_groups": [
                    {"instance_group_name": "x" * 65, "hosts": ["algo-1"]},
                    HETERO["instance_groups"][1],
                ],
            },
            "1 to 64 characters",
        ),
        (
            {
                **HETERO,
                "instance_groups": [
                    {"instance_group_name": "train", "hosts": []},
                    HETERO["instance_groups"][1],
                ],
            },
            "at least one host",
        ),
    ],
)
def test_bad_instance_groups(tmp_path, resource, message):
    with pytest.raises(ConfigError, match="resourceconfig.json") as error:
        read_job_config(config(tmp_path, resource))
    assert message in str(error.value)


@pytest.mark.parametrize(
    "resource, message",
    [
        (
            {"current_host": "algo-3", "hosts": ["algo-1", "algo-2"]},
            "current_host 'algo-3' is not among hosts",
        ),
        ({"current_host": "algo-1", "hosts": []}, "`hosts` is empty"),
        ({"current_host": "algo-1", "hosts": "algo-1"}, "`hosts` must be a list of host names"),
        ({"hosts": ["algo-1"]}, "`current_host` must be a host name"),
        ({"current_host": "algo-1", "hosts": ["algo-1", "algo-1"]}, "`hosts` has duplicates"),
        ([1, 2], "must hold a JSON dict, not list"),
    ],
)
def test_bad_resource_config(tmp_path, resource, message):
    with pytest.raises(ConfigError, match="resourceconfig.json") as error:
        read_job_config(config(tmp_path, resource))
    assert message in str(error.value)


def test_invalid_json_names_the_file(tmp_path):
    paths = MlPaths(tmp_path)
    paths.config_dir.mkdir(parents=True)
    paths.hyperparameters.write_text("{not json")
    with pytest.raises(ConfigError, match="hyperparameters.json is not valid JSON"):
        read_job_config(paths)


@pytest.mark.parametrize("name", ["checkpointconfig.json", "tensorboardoutputconfig.json"])
def test_the_folders_a_job_configured_are_used_and_checked(tmp_path, name):
    paths = MlPaths(tmp_path)
    paths.config_dir.mkdir(parents=True)
    assert read_job_config(paths).paths == paths  # no file: SageMaker's default folders
    (paths.config_dir / name).write_text('{"LocalPath": "/mnt/job-folder", "S3Uri": "s3://b/p"}')
    configured = read_job_config(paths).paths
    assert (
        configured.checkpoint_dir if name.startswith("checkpoint") else configured.tensorboard_dir
    ) == Path("/mnt/job-folder")
    (paths.config_dir / name).write_text('{"LocalPath": "relative/folder"}')
    with pytest.raises(ConfigError, match=f"{name}: `LocalPath` must be an absolute folder"):
        read_job_config(paths)


@pytest.mark.parametrize(
    "channel, message",
    [
        (
            {"TrainingInputMode": "Stream"},
            "TrainingInputMode 'Stream'; choose between File, FastFile, Pipe",
        ),
        (
            {"S3DistributionType": "Random"},
            "S3DistributionType 'Random'; choose between FullyReplicated, ShardedByS3Key",
        ),
        ("File", "channel 'train' must be a JSON object"),
    ],
)
def test_bad_input_data_config(tmp_path, channel, message):
    with pytest.raises(ConfigError) as error:
        read_job_config(config(tmp_path, inputdata={"train": channel}))
    assert message in str(error.value)


def test_written_job_reads_back_as_written(tmp_path):
    job = JobConfig(
        MlPaths(tmp_path),
        ResourceConfig("algo-2", ("algo-1", "algo-2", "algo-3"), "eth1", "ml.c5.xlarge"),
        {"epochs": "3", "optimizer": '"adam"', "sagemaker_program": "train.py"},
        {
            "train": Channel("train", "text/csv", "FastFile", "ShardedByS3Key"),
            "validation": Channel("validation", "application/x-npz"),
        },
    )
    write_job_config(job)
    assert read_job_config(job.paths) == job
    resources = json.loads(job.paths.resource_config.read_text())
    assert resources["current_group_name"] == "homogeneousCluster"
    assert resources["instance_groups"] == [
        {
            "instance_group_name": "homogeneousCluster",
            "instance_type": "ml.c5.xlarge",
            "hosts": ["algo-1", "algo-2", "algo-3"],
        }
    ]


def test_hyperparameters_are_written_as_sagemaker_strings_and_decode_back(tmp_path):
    values = {
        "epochs": 3,
        "learning_rate": 0.05,
        "fp16_allreduce": True,
        "model": "cnn",
        "image_shape": "8,8,1",
        "layers": [64, 32],
        "options": {"a": None},
    }
    write_job_config(
        JobConfig(MlPaths(tmp_path), ResourceConfig("algo-1", ("algo-1",)), values, {})
    )
    written = json.loads(MlPaths(tmp_path).hyperparameters.read_text())
    assert written == {
        "epochs": "3",
        "learning_rate": "0.05",
        "fp16_allreduce": "true",
        "model": "cnn",
        "image_shape": "8,8,1",
        "layers": "[64, 32]",
        "options": '{"a": null}',
    }
    assert {name: decode(text) for name, text in written.items()} == values
    trainer, _ = parse(
        TrainerConfig, read_job_config(MlPaths(tmp_path)).hyperparameters, allow_unknown=True
    )
    assert (
        trainer.epochs,
        trainer.learning_rate,
        trainer.fp16_allreduce,
        trainer.model,
        trainer.image_dims,
    ) == (3, 0.05, True, "cnn", (8, 8, 1))


def test_hosts_are_written_sorted_as_sagemaker_does(tmp_path):
    job = JobConfig(MlPaths(tmp_path), ResourceConfig("algo-2", ("algo-2", "algo-1")), {}, {})
    write_job_config(job)
    assert json.loads(job.paths.resource_config.read_text())["hosts"] == ["algo-1", "algo-2"]
    assert read_job_config(job.paths).resources.hosts == ("algo-1", "algo-2")
