"""The real `train` command: dry runs, configuration errors, data errors."""

import json

import pytest

from tests.conftest import failure_of, run_train


def test_dry_run_prints_the_plan_and_starts_nothing(make_job):
    root = make_job(
        {
            "global_batch_size": 512,
            "max_device_batch_size": 64,
            "processes_per_host": 2,
            "learning_rate": 0.1,
            "base_batch_size": 256,
        }
    )
    result = run_train(root, "--dry-run", timeout=60)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["hosts"] == ["algo-1"] and plan["leader"] == "algo-1"
    assert (plan["processes_per_host"], plan["world_size"]) == (2, 2)
    assert (
        plan["global_batch"],
        plan["per_device_batch"],
        plan["micro_batch"],
        plan["accumulation_steps"],
    ) == (512, 256, 64, 4)
    assert plan["learning_rate"] == pytest.approx(0.2)
    assert plan["mpirun"][0] == "mpirun" and plan["mpirun"][-2:] == ["-m", "train.rank_main"]
    assert not (root / "output" / "failure").exists() and not (root / "model").exists()


def test_dry_run_of_a_worker_in_a_cluster(make_job):
    root = make_job({}, hosts=["algo-2", "algo-1"], current="algo-2")
    plan = json.loads(run_train(root, "--dry-run", timeout=60).stdout)
    assert plan["hosts"] == ["algo-1", "algo-2"] and plan["leader"] == "algo-1"
    assert plan["is_leader"] is False and "algo-1:1,algo-2:1" in plan["mpirun"]


@pytest.mark.parametrize(
    "hyperparameters, message",
    [
        ({"epochs": "zero"}, "hyperparameter epochs='zero' is invalid: expected an integer >= 1"),
        (
            {"learnin_rate": "0.1"},
            "unknown hyperparameter(s) learnin_rate (did you mean learning_rate for learnin_rate?)",
        ),
        (
            {"global_batch_size": "100", "processes_per_host": "3"},
            "global_batch_size=100 cannot be split evenly over 3 devices",
        ),
        ({"mpi_options": "eth0"}, "'eth0' is not an mpirun option"),
    ],
)
def test_configuration_errors_fail_fast_with_what_to_change(make_job, hyperparameters, message):
    root = make_job(hyperparameters)
    result = run_train(root, timeout=60)
    assert result.returncode == 2
    assert message in failure_of(root)
    assert "Traceback" not in result.stdout + result.stderr
    assert message in result.stderr


@pytest.mark.parametrize("mode", [{}, {"sagemaker_program": "train.py"}])
def test_a_progress_timeout_under_the_minimum_is_refused_before_any_rank_starts(make_job, mode):
    root = make_job({"progress_timeout": "10", **mode})
    result = run_train(root, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "progress_timeout=10 is too short" in failure_of(root)
    assert "set it to 120 or more (the minimum), or 0 to turn the watchdog off" in failure_of(root)
    assert "launcher: running: mpirun" not in result.stdout


def test_an_unwritable_failure_file_keeps_the_exit_code_and_says_why(make_job):
    root = make_job({"epochs": "zero"})
    (root / "output").mkdir(exist_ok=True)
    (root / "output" / "failure").mkdir()  # a folder where the file should go: cannot write
    result = run_train(root, timeout=60)
    assert result.returncode == 2
    assert f"cannot write the failure file {root / 'output' / 'failure'}" in result.stderr
    assert "the reason was: hyperparameter epochs='zero' is invalid" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_missing_script_in_script_mode(make_job):
    root = make_job({"sagemaker_program": "train.py"})
    result = run_train(root, timeout=60)
    assert result.returncode == 2
    assert "script mode: program 'train.py' not found at" in failure_of(root)


def test_bad_training_data_is_named_in_the_failure(make_job):
    """A DataError raised in a rank is the job's exit 2 and its failure file, without a
    traceback (each kind of bad data and its message: tests/train/test_data.py)."""
    root = make_job({"processes_per_host": 1})
    (root / "input" / "data" / "train" / "digits.csv").write_text("1,2,3\n2,nan,4\n")
    result = run_train(root, timeout=180)
    assert result.returncode == 2  # a data error raised in a rank is a configuration error
    failure = failure_of(root)
    assert "rank 0 on host algo-1 failed" in failure, failure
    assert "digits.csv: line 2 has a NaN or infinite value" in failure, failure
    assert "Traceback" not in failure


def test_a_file_of_no_known_kind_is_read_as_the_channels_content_type(make_job):
    root = make_job({"processes_per_host": 1})
    train = root / "input" / "data" / "train"
    (train / "digits.csv").unlink()
    (train / "notes.txt").write_text("hello")
    result = run_train(root, timeout=180)
    assert result.returncode == 2
    # the channel's ContentType (inputdataconfig.json) is text/csv: notes.txt is read as CSV
    assert "notes.txt: each row needs a label and at least one feature" in failure_of(root)


def test_pipe_mode_is_refused_before_anything_starts(make_job):
    root = make_job({"processes_per_host": 1})
    config = root / "input" / "config" / "inputdataconfig.json"
    channels = json.loads(config.read_text())
    channels["train"]["TrainingInputMode"] = "Pipe"
    config.write_text(json.dumps(channels))
    result = run_train(root, timeout=60)
    assert result.returncode == 2
    assert (
        "channel train uses Pipe input mode, which this container does not read; use File "
        "or FastFile" in failure_of(root)
    )
