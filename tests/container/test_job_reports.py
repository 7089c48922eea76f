"""What a finished script-mode job tells its user, through the real launcher and mpirun: the
failure file of an error with a long message."""

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
    assert failure.startswith("rank 0 on host algo-1 failed (exit code 1): ValueError: "
                              "column 7 of row 12 in train.csv: üüü"), failure
    assert failure.endswith("üü is not a number (at long_error.py, line 3: "
                            "raise ValueError(message))"), failure
    assert failure.count(ELISION) == 1 and len(failure.encode()) <= FAILURE_LIMIT
