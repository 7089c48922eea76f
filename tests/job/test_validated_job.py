"""The job is validated once, by the launcher, and every rank runs exactly what it decided."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from container.plan import make_plan
from job.errors import ConfigError
from job.paths import MlPaths
from job.rank_job import JOB_ENV, RankJob, read_rank_job
from job.sagemaker_config import Channel, JobConfig, ResourceConfig
from job.validated import validate_hyperparameters

PYTHON = "/venv/bin/python"


def plan_of(paths: MlPaths, hyperparameters: dict, environ=None, hosts=("algo-1",)):
    job = JobConfig(
        paths, ResourceConfig(hosts[0], tuple(hosts)), hyperparameters, {"train": Channel("train")}
    )
    environ = environ or {}
    return make_plan(
        job,
        validate_hyperparameters(hyperparameters, environ),
        gpu_count=0,
        python=PYTHON,
        runtime=Path("/run/job"),
        environ=environ,
    )


def job_in_argv(argv) -> str:
    """The value the ranks get: what follows `-x TRAIN_JOB=` in the mpirun argv."""
    values = [item.split("=", 1)[1] for item in argv if item.startswith(f"{JOB_ENV}=")]
    assert len(values) == 1, argv
    return values[0]


def with_script(tmp_path, name="train.py") -> MlPaths:
    paths = MlPaths(tmp_path)
    paths.code_dir.mkdir(parents=True, exist_ok=True)
    (paths.code_dir / name).write_text("")
    return paths


def test_ranks_receive_the_trainer_config_and_batch_plan_the_launcher_made(tmp_path):
    plan = plan_of(
        MlPaths(tmp_path),
        {
            "global_batch_size": "512",
            "max_device_batch_size": 64,
            "learning_rate": "0.1",
            "base_batch_size": "256",
            "optimizer": '"sgd"',
            "fp16_allreduce": "True",
            "sagemaker_job_name": '"job-1"',
        },
        hosts=("algo-1", "algo-2"),
    )
    received = read_rank_job({JOB_ENV: job_in_argv(plan.mpirun)})
    assert received == plan.job
    batches = received.batches
    assert (
        batches.world_size,
        batches.global_batch,
        batches.per_device_batch,
        batches.micro_batch,
        batches.accumulation_steps,
    ) == (2, 512, 256, 64, 4)
    assert batches.learning_rate == pytest.approx(0.2)
    trainer = received.trainer
    assert (trainer.optimizer, trainer.fp16_allreduce, trainer.learning_rate) == ("sgd", True, 0.1)
    assert received.program == "" and received.script_hyperparameters == {}


@pytest.mark.parametrize(
    "hyperparameters, environ",
    [
        ({"sagemaker_program": '"train.py"'}, {}),
        ({"program": "train.py"}, {}),
        ({}, {"SAGEMAKER_PROGRAM": "train.py"}),
    ],
)
def test_a_script_sees_its_hyperparameters_decoded_however_the_program_was_named(
    tmp_path, hyperparameters, environ
):
    plan = plan_of(
        with_script(tmp_path),
        {
            **hyperparameters,
            "epochs": "3",
            "optimizer": '"adam"',
            "layers": "[64, 32]",
            "processes_per_host": "1",
            "sagemaker_region": '"us-east-1"',
        },
        environ,
    )
    received = read_rank_job({JOB_ENV: job_in_argv(plan.mpirun)})
    assert received.program == "train.py" and received.trainer is None
    assert received.script_hyperparameters == {
        "epochs": 3,
        "optimizer": "adam",
        "layers": [64, 32],
        "sagemaker_region": "us-east-1",
        "sagemaker_program": "train.py",
    }  # the launcher's processes_per_host is consumed


def test_the_program_key_wins_over_the_environment():
    settings = validate_hyperparameters(
        {"sagemaker_program": "mine.py"}, {"SAGEMAKER_PROGRAM": "theirs.py"}
    )
    assert settings.program == "mine.py"
    assert validate_hyperparameters({}, {"SAGEMAKER_PROGRAM": "theirs.py"}).program == "theirs.py"
    assert validate_hyperparameters({}, {}).program == ""


def test_unknown_names_are_refused_with_the_nearest_valid_one():
    with pytest.raises(ConfigError) as error:
        validate_hyperparameters({"learnin_rate": "0.1", "zzz": "1"}, {})
    message = str(error.value)
    assert message.startswith(
        "unknown hyperparameter(s) learnin_rate, zzz (did you mean learning_rate for learnin_rate?)"
    )
    assert "the launcher takes" in message and "processes_per_host" in message
    assert f"set program=<file under {MlPaths().code_dir}>" in message


def test_script_mode_passes_any_name_to_the_script():
    settings = validate_hyperparameters({"program": "x.py", "learnin_rate": "0.1"}, {})
    assert settings.trainer is None and settings.user == {"learnin_rate": "0.1"}


def test_a_job_too_large_for_one_environment_variable_is_refused_before_start(tmp_path):
    big = {f"table_{n}": "x" * 2500 for n in range(60)}  # SageMaker allows 100 x 2500
    with pytest.raises(ConfigError, match="at most 131072 bytes; pass large values in a file"):
        plan_of(with_script(tmp_path), {"sagemaker_program": "train.py", **big})


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "{}",
        '{"program": "", "script_hyperparameters": {}, '
        '"trainer": {"epochs": 3, "no_such_field": 1}, "batches": null}',
    ],
)
def test_a_damaged_job_names_the_variable(text):
    with pytest.raises(ConfigError, match=f"{JOB_ENV} does not hold a job written by"):
        RankJob.from_json(text)


@pytest.mark.parametrize("program", [["train.rank_main"], ["train.script_runner", "x.py"]])
def test_a_rank_started_without_the_launcher_says_how_to_start_it(program):
    env = {k: v for k, v in os.environ.items() if k != JOB_ENV}
    result = subprocess.run(
        [sys.executable, "-m", *program], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 1  # the rank program fails; the launcher maps kinds to codes
    assert (
        "TRAIN-FAILURE rank=0 host=" in result.stderr
        and f"ConfigError: {JOB_ENV} is not set: rank programs run under the launcher"
        in result.stderr
        and "run `train --ml-root DIR`" in result.stderr
    ), result.stderr


@pytest.mark.parametrize(
    "given, message",
    [
        (
            {"progress_timeout": "10"},
            "hyperparameter progress_timeout=10 is too short: a healthy "
            "rank may sit idle up to 60 s (as Keras's fit returns, tf.data's autotuning winds down), "
            "which the watchdog would end as hung; set it to 120 or more (the minimum), or 0 to turn "
            "the watchdog off",
        ),
        ({"progress_timeout": 119.5}, "progress_timeout=119.5 is too short"),
        (
            {"first_progress_timeout": "10"},
            "hyperparameter first_progress_timeout='10' is invalid: expected a number >= 120",
        ),
    ],
)
@pytest.mark.parametrize("mode", [{}, {"sagemaker_program": "train.py"}])
def test_a_watchdog_allowance_that_would_end_a_healthy_job_is_refused(given, message, mode):
    """The launcher used to accept progress_timeout=10 with a warning, and the watchdog then
    ended a healthy Horovod fit as hung as it returned: refused now, in both modes."""
    with pytest.raises(ConfigError) as refused:
        validate_hyperparameters({**given, **mode}, {})
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "given", [{"progress_timeout": 0}, {"progress_timeout": 120}, {"first_progress_timeout": 120}]
)
def test_the_minimum_allowance_and_the_watchdog_off_are_accepted(given):
    launch = validate_hyperparameters(given, {}).launch
    assert [getattr(launch, name) for name in given] == list(given.values())


@pytest.mark.parametrize(
    "hyperparameters, environ, submit, region",
    [
        ({}, {}, "", None),
        ({}, {"SAGEMAKER_SUBMIT_DIRECTORY": "s3://b/env.tar.gz"}, "s3://b/env.tar.gz", None),
        (
            {"sagemaker_submit_directory": '"s3://b/hp.tar.gz"'},
            {"SAGEMAKER_SUBMIT_DIRECTORY": "s3://b/env.tar.gz"},
            "s3://b/hp.tar.gz",
            None,
        ),
        ({}, {"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-west-2"}, "", "eu-west-1"),
        ({"sagemaker_region": '"ap-south-1"'}, {"AWS_REGION": "eu-west-1"}, "", "ap-south-1"),
        ({"sagemaker_region": '""'}, {"AWS_DEFAULT_REGION": "us-west-2"}, "", None),
    ],
)
def test_the_submit_directory_and_region_are_resolved_once_from_the_environment_given(
    hyperparameters, environ, submit, region
):
    """The validated job says where the code comes from and which region fetches it, from the
    environment it was handed (not the process's own): the hyperparameter, else the variable;
    no region leaves boto3 to read AWS_DEFAULT_REGION itself."""
    settings = validate_hyperparameters({"program": "train.py", **hyperparameters}, environ)
    assert (settings.launch.submit_directory, settings.region) == (submit, region)
