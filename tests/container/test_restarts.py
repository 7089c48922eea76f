"""Restarts inside the job (`max_restarts`, container.restarts) on real launchers, mpirun and
ranks: what is restarted (a killed or raising rank, a hung job), what is not (a configuration
error, a stop, a failure that repeats itself), on one host and across two loopback hosts."""

import json
import re
import signal
import subprocess

import numpy as np
import psutil
import pytest

from container.failure import Outcome
from container.restarts import Attempt, why_not_restart
from job.protocol import FailureKind
from tests.conftest import failure_of, run_train, start_until, stop_job
from tests.container.test_multi_host import HOSTS, cluster, start  # noqa: F401
from tests.train.test_exact_resume import EXACT, final_values
from tests.waiting import eventually

RANK_FAILED = Outcome.failed(FailureKind.RANK, "rank 1 on algo-1 failed: ValueError: x")


@pytest.mark.parametrize(
    "outcome, failed, allowed, expected",
    [
        (RANK_FAILED, [Attempt(1, "a", "epoch-000001")], 1, None),
        (Outcome.failed(FailureKind.HUNG, "no progress"), [Attempt(4, "h", "")], 1, None),
        (
            RANK_FAILED,
            [Attempt(1, "a", "")] * 2,
            1,
            "1 restart(s) allowed (max_restarts), all used",
        ),
        (RANK_FAILED, [Attempt(1, "a", "epoch-000001")] * 2, 5, "failed twice the same way"),
        (RANK_FAILED, [Attempt(1, "a", "epoch-000001"), Attempt(1, "a", "epoch-000002")], 5, None),
        # every rank raises the same bug; which one reports first is chance
        (
            RANK_FAILED,
            [
                Attempt(1, "rank 1 on host algo-1 failed (exit code 1): ValueError: x", ""),
                Attempt(1, "rank 0 on host algo-2 failed (exit code 1): ValueError: x", ""),
            ],
            5,
            "failed twice the same way",
        ),
        (
            RANK_FAILED,
            [
                Attempt(1, "rank 1 on host algo-1 failed (exit code 1): ValueError: x", ""),
                Attempt(1, "rank 1 on host algo-1 failed (exit code 1): OSError: y", ""),
            ],
            5,
            None,
        ),
        (
            Outcome.failed(FailureKind.RANK, "DataError", rank_code=2),
            [Attempt(2, "d", "")],
            5,
            "not restarted",
        ),
        (
            Outcome.failed(FailureKind.STOPPED, "stopped"),
            [Attempt(143, "s", "")],
            5,
            "not restarted",
        ),
        (
            Outcome.failed(FailureKind.CLUSTER, "lost host"),
            [Attempt(3, "l", "")],
            5,
            "not restarted",
        ),
    ],
)
def test_what_is_restarted(outcome, failed, allowed, expected):
    why = why_not_restart(outcome, failed, allowed)
    assert why is None if expected is None else expected in why


def attempts_of(root) -> list[dict]:
    path = root / "output" / "data" / "attempts.json"
    return json.loads(path.read_text()) if path.exists() else []


def rank_process(launcher: subprocess.Popen, rank: int) -> psutil.Process | None:
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if "train.rank_main" in " ".join(child.cmdline()) and child.environ().get(
                "OMPI_COMM_WORLD_RANK"
            ) == str(rank):
                return child
        except psutil.Error:
            continue
    return None


@pytest.mark.slow  # three 2-rank jobs; make test keeps a restart (below) and exact resume
def test_a_rank_killed_mid_epoch_is_restarted_and_the_job_ends_as_one_never_killed(make_job):
    """SIGKILL (the out-of-memory killer's signature) to rank 1 in epoch 2, after a checkpoint
    the clock asked for inside that epoch (checkpoint_every_minutes): every rank runs again
    from that checkpoint, at its step, and the job ends with a never-killed job's weights."""
    whole = make_job(EXACT, name="whole")
    assert (result := run_train(whole)).returncode == 0, result.stdout[-3000:]
    killed = make_job({**EXACT, "max_restarts": 1, "checkpoint_every_minutes": 0.01}, name="killed")
    job, seen = start_until(killed, "METRICS epoch=1 ")
    eventually(
        lambda: list((killed / "checkpoints").glob("epoch-000001.*")),  # inside epoch 2
        "no checkpoint inside epoch 2",
        60,
    )
    rank_process(job, 1).send_signal(signal.SIGKILL)
    output = "".join(seen) + job.communicate(timeout=240)[0]
    assert job.returncode == 0, output[-3000:]
    assert (
        "attempt 1 failed (exit code" in output
        and "restarting every rank on every host from epoch-000001." in output
        and "(restart 1 of 1)" in output
    ), output[-3000:]
    assert re.search(r"trainer: resumed from \S+epoch-000001\.\d+ at epoch 2, step \d+", output), (
        output[-3000:]
    )
    assert "the job succeeded after 1 restart(s)" in output
    [attempt] = attempts_of(killed)
    assert attempt["checkpoint"].startswith("epoch-000001.") and "rank 1" in attempt["reason"]
    expected, got = final_values(whole), final_values(killed)
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        # exact resume, here after a SIGKILL: ~1e-4 relative (tests/train/test_exact_resume.py)
        np.testing.assert_allclose(got[name], value, rtol=1e-3, atol=1e-6, err_msg=name)


RAISES_ONCE = """
import os, sys
marker = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "failed-once")
if int(os.environ["OMPI_COMM_WORLD_RANK"]) == 1 and not os.path.exists(marker):
    open(marker, "w").close()
    raise RuntimeError("the first attempt of rank 1 fails")
print("rank", os.environ["OMPI_COMM_WORLD_RANK"], "done", flush=True)
"""


def test_every_host_takes_part_in_a_restart(cluster):
    """Two loopback hosts: rank 1 (on the worker) raises once; the leader restarts the ranks
    of both hosts, and both launchers end with 0."""
    roots = cluster({"max_restarts": 2}, program="once.py", source=RAISES_ONCE)
    launchers = {host: start(roots[host]) for host in reversed(HOSTS)}
    outputs = {host: launcher.communicate(timeout=180)[0] for host, launcher in launchers.items()}
    leader = outputs[HOSTS[0]]
    assert {host: launcher.returncode for host, launcher in launchers.items()} == {
        host: 0 for host in HOSTS
    }, leader[-3000:]
    assert "restarting every rank on every host from the start (no checkpoint yet)" in leader
    assert leader.count("rank 1 done") == 1, leader[-2000:]  # rank 0 ran in both attempts
    [attempt] = attempts_of(roots[HOSTS[0]])
    assert "the first attempt of rank 1 fails" in attempt["reason"], attempt


@pytest.mark.parametrize(
    "source, code, says",
    [
        ('raise ValueError("always the same bug")\n', 1, "failed twice the same way"),
        ("import sys\nsys.exit(2)\n", 2, "not restarted"),
    ],
)
def test_a_failure_that_repeats_or_is_the_users_is_not_restarted_on(
    make_script_job, source, code, says
):
    root = make_script_job("fails.py", {"max_restarts": 3, "processes_per_host": 2}, source)
    result = run_train(root, timeout=180)
    assert result.returncode == code, result.stdout[-2000:] + result.stderr[-2000:]
    assert says in result.stdout, result.stdout[-2000:]
    assert len(attempts_of(root)) == (2 if code == 1 else 1)
    if code == 1:
        assert "(attempt 2; every attempt in output/data/attempts.json)" in failure_of(root)


HANGS_ONCE = """
import os, time
marker = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "hung-once")
if not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(600)
print("done", flush=True)
"""


@pytest.mark.slow  # waits out the shortest progress_timeout the launcher accepts (120 s)
def test_a_hung_job_is_restarted(make_script_job):
    root = make_script_job(
        "hangs.py",
        {"max_restarts": 1, "progress_timeout": 120, "first_progress_timeout": 120},
        HANGS_ONCE,
    )
    result = run_train(root, timeout=360)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    [attempt] = attempts_of(root)
    assert attempt["exit_code"] == 4 and "no progress" in attempt["reason"], attempt


def test_a_stopped_job_is_not_restarted(make_script_job):
    stopped = make_script_job(
        "sleeps.py",
        {"max_restarts": 3},
        'import time\nprint("up", flush=True)\ntime.sleep(600)\n',
        name="stopped",
    )
    assert "restarting" not in stop_job(stopped, "up", delay=0.5)
