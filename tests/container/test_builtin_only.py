"""An image built with SCRIPT_MODE=off runs its built-in trainer and nothing a job brings.

The launcher itself (`container.train_cli.launch`, in this process) with the image's marker
file moved to a temporary folder: its location is a module constant, which nothing a job
controls can change. The image built with the marker is in tests/image/test_trust.py.
"""

from pathlib import Path

import pytest

from container import train_cli
from job.paths import MlPaths
from job.validated import BUILTIN_ONLY_MARKER
from tests.conftest import failure_of
from tests.container.test_sdk3_source_code import sdk3_files

ROOT = Path(__file__).resolve().parents[2]
REFUSAL = "this algorithm runs only its built-in trainer"
# Would leave this file behind if the job's own code ever ran.
SCRIPT = "from pathlib import Path\nPath(__file__).with_name('ran').write_text('yes')\n"


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """The image's marker, present."""
    path = tmp_path / "builtin-trainer-only"
    path.write_text("")
    monkeypatch.setattr(train_cli, "BUILTIN_ONLY_MARKER", path)
    return path


def with_code(root: Path) -> Path:
    (root / "code").mkdir(exist_ok=True)
    (root / "code" / "train.py").write_text(SCRIPT)
    return root


def launch(root: Path, dry_run: bool = False) -> int:
    return train_cli.launch(MlPaths(root), dry_run=dry_run)


@pytest.mark.parametrize(
    "hyperparameters, named",
    [
        ({"program": "train.py"}, "hyperparameter program"),
        ({"sagemaker_program": '"train.py"'}, "hyperparameter sagemaker_program"),
        (
            {"submit_directory": "s3://bucket/src/sourcedir.tar.gz"},
            "hyperparameter submit_directory",
        ),
        (
            {"sagemaker_submit_directory": '"file:///opt/ml/code"'},
            "hyperparameter sagemaker_submit_directory",
        ),
        ({"mpi_options": "-x LD_PRELOAD=/opt/ml/code/x.so"}, "hyperparameter mpi_options"),
        (
            {"sagemaker_mpi_custom_mpi_options": "--mca plm_rsh_agent sh"},
            "hyperparameter sagemaker_mpi_custom_mpi_options",
        ),
    ],
)
def test_hyperparameters_that_run_the_jobs_code_are_refused(
    make_job, marker, capsys, hyperparameters, named
):
    root = with_code(make_job(hyperparameters))
    assert launch(root) == 2
    reason = failure_of(root)
    assert reason.startswith(REFUSAL) and f"leave out {named}" in reason
    assert "the built-in trainer takes" in reason and "learning_rate" in reason
    assert REFUSAL in capsys.readouterr().err
    assert not (root / "code" / "ran").exists()


@pytest.mark.parametrize(
    "variable, value",
    [
        ("SAGEMAKER_PROGRAM", "train.py"),
        ("SAGEMAKER_SUBMIT_DIRECTORY", "s3://bucket/src/sourcedir.tar.gz"),
    ],
)
def test_the_environment_variables_of_script_mode_are_refused(
    make_job, marker, monkeypatch, variable, value
):
    root = with_code(make_job({}))
    monkeypatch.setenv(variable, value)
    assert launch(root) == 2
    assert f"leave out environment variable {variable}" in failure_of(root)


def test_sdk3_source_code_is_refused(make_job, marker):
    root = make_job({"epochs": "1"})
    code = sdk3_files(
        root, distributed={"process_count_per_node": 1, "mpi_additional_options": ["-x", "A=1"]}
    )
    (code / "train.py").write_text(SCRIPT)
    assert launch(root) == 2
    reason = failure_of(root)
    assert reason.startswith(REFUSAL) and "SDK 3's source_code=SourceCode(...)" in reason
    assert "hyperparameter" not in reason.split(": leave out ")[1].split(";")[0]
    assert not (code / "ran").exists()


def test_every_way_given_at_once_is_named(make_script_job, marker, monkeypatch):
    root = make_script_job("train.py", {"mpi_options": "-x A=1"}, SCRIPT)
    monkeypatch.setenv("SAGEMAKER_SUBMIT_DIRECTORY", "s3://bucket/src.tar.gz")
    assert launch(root) == 2
    assert (
        "leave out hyperparameter sagemaker_program, hyperparameter mpi_options, "
        "environment variable SAGEMAKER_SUBMIT_DIRECTORY;"
    ) in failure_of(root)


def test_the_builtin_trainer_and_empty_values_still_run(make_job, marker, capsys):
    root = make_job({"epochs": "1", "program": "", "sagemaker_mpi_custom_mpi_options": ""})
    assert launch(root, dry_run=True) == 0
    assert '"mode": "builtin"' in capsys.readouterr().out


def test_without_the_marker_script_mode_runs(make_script_job, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train_cli, "BUILTIN_ONLY_MARKER", tmp_path / "absent")
    root = make_script_job("train.py", {"mpi_options": "-x A=1"}, SCRIPT)
    assert launch(root, dry_run=True) == 0
    assert '"mode": "script"' in capsys.readouterr().out


def test_the_dockerfile_writes_the_marker_the_launcher_reads():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"> {BUILTIN_ONLY_MARKER}" in dockerfile
    assert not str(BUILTIN_ONLY_MARKER).startswith(str(MlPaths().root))
