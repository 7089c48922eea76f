"""What a finished script-mode job tells its user, through the real launcher and mpirun: the
failure file of an error with a long message, and the warning of a job that saved no model."""

import os
import time
from pathlib import Path

from container.empty_model import WARNING_FILE, is_empty, model_like_files, warning_text
from container.failure import FAILURE_LIMIT
from job.protocol import ELISION
from tests.conftest import failure_of, run_train

LONG_ERROR = """import os
message = "column 7 of row 12 in train.csv: " + "ü" * 2950 + " is not a number"
raise ValueError(message)
"""


def test_a_long_error_keeps_its_type_head_tail_and_line_in_the_failure_file(make_script_job):
    root = make_script_job("long_error.py", {"processes_per_host": 1}, LONG_ERROR)
    result = run_train(root, timeout=120)
    assert result.returncode == 1, result.stdout[-3000:]
    failure = failure_of(root)
    assert failure.startswith(
        "rank 0 on host algo-1 failed (exit code 1): ValueError: "
        "column 7 of row 12 in train.csv: üüü"
    ), failure
    assert failure.endswith(
        "üü is not a number (at long_error.py, line 3: raise ValueError(message))"
    ), failure
    assert failure.count(ELISION) == 1 and len(failure.encode()) <= FAILURE_LIMIT


SAVES_NOWHERE = """import os
os.makedirs("ckpt/variables", exist_ok=True)  # a keras.io guide's checkpoint folder
for name in ("ckpt/saved_model.pb", "ckpt/variables/variables.index", "model.keras", "notes.txt"):
    open(name, "w").write("weights")
"""

SAVES_IN_MODEL_DIR = """import os
folder = os.path.join(os.environ["SM_MODEL_DIR"], "model", "1")
os.makedirs(folder)
open(os.path.join(folder, "saved_model.pb"), "w").write("weights")
"""


def test_a_job_that_saved_no_model_completes_with_a_warning_naming_its_files(make_script_job):
    root = make_script_job("guide.py", {"processes_per_host": 1}, SAVES_NOWHERE)
    shipped = root / "code" / "pretrained.h5"  # came with the code, an hour before the job
    shipped.write_text("weights")
    an_hour_ago = time.time() - 3600
    os.utime(shipped, (an_hour_ago, an_hour_ago))
    result = run_train(root, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    warning = (root / "output" / "data" / WARNING_FILE).read_text()
    assert warning.startswith(f"the job completed but saved no model: {root / 'model'} is empty"), (
        warning
    )
    assert 'Save the model into os.environ["SM_MODEL_DIR"]' in warning
    assert warning.rstrip().endswith(
        f"The script left these in its working folder {root / 'code'}: ckpt/saved_model.pb, "
        f"ckpt/variables/variables.index, model.keras."
    ), warning
    assert f"launcher: WARNING: {warning.rstrip()}" in result.stderr
    assert not (root / "output" / "failure").exists()


def test_a_job_that_saved_its_model_gets_no_warning(make_script_job):
    root = make_script_job("saves.py", {"processes_per_host": 1}, SAVES_IN_MODEL_DIR)
    result = run_train(root, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (root / "model" / "model" / "1" / "saved_model.pb").exists()
    assert "WARNING" not in result.stdout + result.stderr
    assert not (root / "output" / "data" / WARNING_FILE).exists()


def test_a_model_folder_of_empty_folders_is_empty(tmp_path):
    (tmp_path / "model" / "1" / "variables").mkdir(parents=True)
    assert is_empty(tmp_path / "model") and is_empty(tmp_path / "missing")
    (tmp_path / "model" / "1" / "saved_model.pb").write_text("weights")
    assert not is_empty(tmp_path / "model")


def test_the_warning_names_a_few_model_files_and_counts_the_rest(tmp_path):
    for index in range(6):
        (tmp_path / f"epoch-{index}.weights.h5").write_text("weights")
    (tmp_path / "train.csv").write_text("1,2\n")
    left = model_like_files(tmp_path, since=0)
    assert left == [f"epoch-{index}.weights.h5" for index in range(6)]
    assert warning_text(Path("/opt/ml/model"), tmp_path, left).endswith(
        f"working folder {tmp_path}: epoch-0.weights.h5, epoch-1.weights.h5, "
        f"epoch-2.weights.h5, epoch-3.weights.h5 and 2 more."
    )
    assert model_like_files(tmp_path, since=time.time() + 60) == []  # none written since
