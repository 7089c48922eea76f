"""Every process a launcher starts is ended with it (container.session): a helper process that a
script or a rank leaves behind, holding the output pipe, neither keeps the launcher waiting
nor outlives the job. Real programs, real signals; the leader's case through the real launcher
and mpirun."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import psutil

from container.session import Session
from container.watchdog import STACK_GRACE
from tests.container.test_multi_host import HOSTS, cluster, start  # noqa: F401
from tests.waiting import eventually

# A helper that writes its pid, then keeps the inherited stdout for a minute.
HELPER = """
import os, signal, sys, time
if "--ignore-stop" in sys.argv:  # the launcher's stop and stack requests (through mpirun)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "--own-session" in sys.argv:
    os.setsid()
with open(sys.argv[1], "w") as out:
    out.write(str(os.getpid()))
print("helper running", flush=True)
time.sleep(60)
"""


def running(pid: int) -> bool:
    """Whether `pid` is alive (a zombie is not: only its parent's wait is missing)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for_pid(path: Path, timeout: float = 30) -> int:
    return int(eventually(lambda: path.exists() and path.read_text(), f"no pid in {path}", timeout))


def program(tmp_path: Path, *helper_args: str, then: str) -> list[str]:
    """A program that starts the helper (its pid in tmp_path/helper.pid), then runs `then`."""
    (tmp_path / "helper.py").write_text(HELPER)
    return [
        sys.executable,
        "-c",
        f"import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(tmp_path / 'helper.py')!r}, "
        f"{str(tmp_path / 'helper.pid')!r}, *{list(helper_args)!r}])\n{then}",
    ]


def test_a_helper_that_ignores_sigterm_is_killed_with_the_program(tmp_path, capfd):
    session = Session(program(tmp_path, "--ignore-term", then="time.sleep(60)"))
    helper = wait_for_pid(tmp_path / "helper.pid")
    started = time.monotonic()
    session.end("the job ended on another host", kill_after=1)
    assert time.monotonic() - started < 5
    assert session.process.wait(timeout=5) == -signal.SIGTERM
    assert not running(helper)
    assert session.members() == {}
    said = capfd.readouterr().out
    assert f"1 of them still running 1 s after SIGTERM (pids {helper}); killing them" in said


def test_what_a_program_leaves_behind_is_ended_as_it_exits(tmp_path, capfd):
    """The program exits at once; its helper holds the pipe for 60 s: the output ends within
    a few seconds, the helper with it."""
    session = Session(program(tmp_path, then="print('program done', flush=True)"))
    started = time.monotonic()
    lines = list(session.output())
    assert time.monotonic() - started < 10, lines
    assert "program done\n" in lines and "helper running\n" in lines
    assert session.process.wait(timeout=1) == 0
    helper = int((tmp_path / "helper.pid").read_text())
    assert not running(helper)
    said = capfd.readouterr().out
    assert "exited (code 0) and left processes running; ending" in said, said
    assert f"pids {helper})" in said, said
    assert session.members() == {}


def test_the_output_ends_when_the_session_is_empty_though_an_escaped_process_holds_it(tmp_path):
    """A daemon that made a session of its own (setsid) keeps the pipe open: the launcher
    stops reading once nothing of the program's session is left, not at the pipe's end."""
    session = Session(program(tmp_path, "--own-session", then="time.sleep(0.5)"))
    helper = wait_for_pid(tmp_path / "helper.pid")
    try:
        started = time.monotonic()
        list(session.output())
        assert time.monotonic() - started < 5
        assert running(helper)  # outside the session: not ours to end (the container's end is)
    finally:
        psutil.Process(helper).kill()


# A rank that leaves a helper behind (its pid in helper-RANK.pid, its own in rank-RANK.pid)
# and completes; the helper holds the rank's output for 60 s and ignores the stop.
RANK_WITH_HELPER = """
import os, subprocess, sys
from mpi4py import MPI
out, rank = os.environ["SM_OUTPUT_DATA_DIR"], os.environ["OMPI_COMM_WORLD_RANK"]
subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "helper_process.py"),
                  os.path.join(out, f"helper-{rank}.pid"), "--ignore-stop"])
with open(os.path.join(out, f"rank-{rank}.pid"), "w") as pid:
    pid.write(str(os.getpid()))
print("rank done", flush=True)
"""


def stop_after_the_ranks(launchers: dict, roots: dict, ranks: int) -> tuple[dict, float, list]:
    """Once every rank has left its helper and exited, SIGTERM every host's launcher (as
    SageMaker does); each one's output, the seconds until the last exited, the helpers' pids."""
    for root in roots:
        (root / "code" / "helper_process.py").write_text(HELPER)
    out = next(iter(roots)) / "output" / "data"  # the ranks' (the leader's TRAIN_ML_ROOT)
    helpers = [wait_for_pid(out / f"helper-{rank}.pid") for rank in range(ranks)]
    for rank in range(ranks):  # mpirun waits for the helpers
        pid = wait_for_pid(out / f"rank-{rank}.pid")
        eventually(lambda pid=pid: not running(pid), f"rank {rank} did not exit", 30)
    started = time.monotonic()
    for launcher in launchers.values():
        launcher.send_signal(signal.SIGTERM)
    outputs = {host: launcher.communicate(timeout=90)[0] for host, launcher in launchers.items()}
    return outputs, time.monotonic() - started, helpers


def test_a_stop_ends_the_helper_a_rank_left_with_the_job_within_the_grace(make_script_job):
    """mpirun waits for the helper to close the rank's output. A stop then ends the job within
    the grace and the ranks' stack time, the helper with it."""
    root = make_script_job(
        "helper.py", {"processes_per_host": 1, "stop_grace": 2}, RANK_WITH_HELPER
    )
    job = start(root)
    outputs, took, helpers = stop_after_the_ranks({"leader": job}, [root], 1)
    assert job.returncode == 143, outputs["leader"][-3000:]
    assert took < 2 + STACK_GRACE + 5, outputs["leader"][-3000:]  # then SIGTERM ends all
    assert not running(helpers[0]), outputs["leader"][-3000:]


def test_a_stop_ends_the_helper_a_rank_left_on_a_worker(cluster):
    """The same on two loopback hosts: the helper of the worker's rank goes when the leader
    reports the job's end, though it outlived the MPI daemon that started its rank."""
    roots = cluster({"stop_grace": 2}, program="helper.py", source=RANK_WITH_HELPER)
    launchers = {host: start(root) for host, root in reversed(roots.items())}
    outputs, took, helpers = stop_after_the_ranks(launchers, list(roots.values()), 2)
    worker = outputs[HOSTS[1]]
    assert {host: launcher.returncode for host, launcher in launchers.items()} == dict.fromkeys(
        HOSTS, 143
    ), outputs[HOSTS[0]][-3000:]
    assert took < 2 + STACK_GRACE + 10, outputs[HOSTS[0]][-3000:]
    assert [running(helper) for helper in helpers] == [False, False], worker[-3000:]
