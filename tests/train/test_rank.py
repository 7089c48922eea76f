"""The rank wrapper's stop: a rank that does not poll exits when the stop arrives, but never
from inside an import, where the exit would surface as that module's import failure. And its
failure: a rank that fails leaves at once, whatever its teardown would wait for."""

import signal
import subprocess
import sys

from tests.conftest import ROOT

SLOW_MODULE = """
import time
print("importing", flush=True)
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    time.sleep(0.01)
print("imported", flush=True)
"""

PROGRAM = """
import sys
sys.path.insert(0, sys.argv[1])
from train.rank import run_rank

def body(context):
    print("started", flush=True)
    if sys.argv[2] == "import":
        import slow_module
    while True:  # a script that never polls for a stop
        pass

run_rank(body)
"""


def start_rank(tmp_path, mode):
    (tmp_path / "slow_module.py").write_text(SLOW_MODULE)
    return subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(tmp_path), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_after(process, line):
    try:
        while (printed := process.stdout.readline()) and printed.strip() != line:
            pass
        process.send_signal(signal.SIGUSR1)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()  # never leave a spinning rank behind; nothing once it has exited
    return process.returncode, out, err


def test_a_stop_during_an_import_waits_for_the_import_then_exits_cleanly(tmp_path):
    code, out, err = stop_after(start_rank(tmp_path, "import"), "importing")
    assert code == 128 + signal.SIGTERM, err
    assert "imported" in out.split()
    assert "Traceback" not in err and "Error" not in err, err


def test_a_stop_outside_an_import_exits_at_once(tmp_path):
    code, out, err = stop_after(start_rank(tmp_path, "loop"), "started")
    assert code == 128 + signal.SIGTERM, err
    assert "importing" not in out.split() and "Traceback" not in err, err


# A failing rank whose teardown waits for peers that wait for it: JAX registers its
# distributed shutdown (a barrier across processes, up to 300 s) with atexit like this.
FAILING = """
import atexit, sys, time
sys.path.insert(0, sys.argv[1])
from train.rank import run_rank

def teardown():
    print("teardown", flush=True)
    time.sleep(0 if sys.argv[2] == "0" else 300)

def body(context):
    atexit.register(teardown)
    print("started", flush=True)
    if sys.argv[2] == "raise":
        raise ValueError("cannot parse row 7")
    sys.exit(int(sys.argv[2]))

run_rank(body)
"""


def fail(mode):
    process = subprocess.run(
        [sys.executable, "-c", FAILING, str(ROOT), mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return process.returncode, process.stdout, process.stderr


def test_a_rank_that_raises_leaves_at_once_with_its_report_and_traceback():
    code, out, err = fail("raise")
    assert code == 1, err
    assert out == "started\n"
    report, traceback = err.split("\n", 1)
    assert "ValueError: cannot parse row 7" in report, err
    assert traceback.startswith("Traceback") and "line 14, in body" in traceback, err


def test_a_rank_that_exits_with_a_code_keeps_it_and_leaves_at_once():
    code, out, err = fail("3")
    assert code == 3, err
    assert "exited with code 3" in err, err
    assert out == "started\n"
    assert fail("0")[:2] == (0, "started\nteardown\n")  # a clean exit tears down
