"""The launcher as PID 1, as in `docker run IMAGE train`: a real PID namespace (unshare)."""

import shutil
import subprocess

import pytest

from tests.conftest import TRAIN, failure_of

ORPHANS = """
import os, time
from mpi4py import MPI
child = os.fork()
if child == 0:              # a daemon, like orted: its child outlives it, re-parented to PID 1
    if os.fork() == 0:
        time.sleep(0.5)
        os._exit(0)
    os._exit(0)
os.waitpid(child, 0)
time.sleep(1.5)
zombies = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            zombies.append(stat)
print(f"ZOMBIES {len(zombies)} {zombies}", flush=True)
if os.environ.get("FAIL_WITH"):
    raise SystemExit(int(os.environ["FAIL_WITH"]))
"""

pytestmark = pytest.mark.skipif(not shutil.which("unshare"), reason="needs util-linux unshare")


def run_as_pid1(root, *env):
    command = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "env",
        *env,
        str(TRAIN),
        "--ml-root",
        str(root),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_orphans_are_reaped_and_the_exit_code_passes_through(make_script_job):
    root = make_script_job("orphans.py", {"processes_per_host": 1}, ORPHANS)
    result = run_as_pid1(root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ZOMBIES 0 []" in result.stdout, result.stdout
    failed = run_as_pid1(root, "FAIL_WITH=7")
    assert failed.returncode == 7
    assert "exited with code 7" in failure_of(root)
