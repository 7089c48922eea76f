"""Failure reasons from mpirun output (texts as OpenMPI 4.1 prints them)."""

import json
import sys

import pytest

from container.failure import FAILURE_LIMIT, Outcome, OutputLog, relayed, summarize, write_failure
from container.oom import ADVICE, CgroupMemory, counting_from_now, host_ran_out, killed
from container.restarts import ATTEMPTS_FILE, run_with_restarts
from container.supervisor import run_supervised
from job.errors import ConfigError
from job.paths import MlPaths
from job.protocol import ELISION, REPORT_LIMIT, FailureKind, rank_failure

HOSTS = ["algo-1", "algo-2"]


def host_of(rank):
    return HOSTS[rank // 2]


def log_of(text):
    log = OutputLog()
    for line in text.splitlines():
        log.add(line)
    return log


FRAME = "-" * 74
CONFIG_REPORT = rank_failure(1, "algo-1", ConfigError("channel train: row 7 has 3 columns"))
SUMMARIES = [  # mpirun's output and exit code, and the outcome the launcher reports
    pytest.param(
        """[1,3]<stderr>:Traceback (most recent call last):
[1,3]<stderr>:ValueError: bad row
[1,3]<stderr>:TRAIN-FAILURE rank=3 host=algo-2 kind=rank: ValueError: bad row
--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD
with errorcode 5.
""",
        1,
        Outcome(
            FailureKind.RANK, "rank 3 on host algo-2 failed (exit code 5): ValueError: bad row", 5
        ),
        id="the rank marker wins and gets the exit code of that rank",
    ),
    pytest.param(
        f"[1,1]<stderr>:{CONFIG_REPORT.line()}\nMPI_ABORT was invoked on rank 1 in "
        f"communicator MPI_COMM_WORLD\nwith errorcode 1.\n",
        1,
        Outcome(
            FailureKind.CONFIG,
            "rank 1 on host algo-1 failed (config error): "
            "ConfigError: channel train: row 7 has 3 columns",
            2,
        ),
        id="a config error in a rank is a config failure whatever the rank exited with",
    ),
    pytest.param(
        """[1,2]<stderr>:Warning: something harmless
[1,2]<stderr>:RuntimeError: CUDA out of memory
[1,2]<stderr>:  see above
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[22869,1],2]
  Exit code:    7
""",
        7,
        Outcome(
            FailureKind.RANK,
            "rank 2 on host algo-2 exited with code 7: RuntimeError: CUDA out of memory",
            7,
        ),
        id="a nonzero exit without marker quotes the last error line of that rank",
    ),
    pytest.param(
        "some output\nmpirun: the end\n\n",
        9,
        Outcome(FailureKind.RANK, "mpirun exited with code 9; last output: mpirun: the end", 9),
        id="anything else quotes the last line",
    ),
    pytest.param(
        f"{FRAME}\nNo OpenFabrics connection schemes reported\n  that they were able\n\n"
        f"{FRAME}\n{FRAME}\nNo network interfaces were found.\n{FRAME}\n",
        1,
        Outcome(
            FailureKind.RANK,
            "mpirun exited with code 1: OpenMPI says: No OpenFabrics connection "
            "schemes reported that they were able",
            1,
        ),
        id="OpenMPI's first framed message is the reason, not its closing dashes",
    ),
]


@pytest.mark.parametrize(("output", "exit_code", "outcome"), SUMMARIES)
def test_the_outcome_of_mpiruns_output(output, exit_code, outcome):
    assert summarize(log_of(output), exit_code, host_of) == outcome


def test_lost_daemon_names_the_host():
    log = log_of("""--------------------------------------------------------------------------
ORTE has lost communication with a remote daemon.

  HNP daemon   : [[4470,0],0] on node algo-1
  Remote daemon: [[4470,0],1] on node algo-2

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
""")
    outcome = summarize(log, 1, host_of)
    assert outcome.reason.startswith("lost contact with host algo-2")
    assert (outcome.kind, outcome.exit_code) == (FailureKind.CLUSTER, 3)


def test_ssh_failures_name_the_host():
    log = log_of(
        "ssh: Could not resolve hostname algo-9: Name or service not known\n"
        "ORTE was unable to reliably start one or more daemons.\n"
    )
    outcome = summarize(log, 1, host_of)
    assert outcome.reason.startswith("mpirun could not start ranks on host algo-9")
    assert outcome.exit_code == 3


def test_failure_file_is_cut_to_what_sagemaker_shows_keeping_its_start_and_end(tmp_path):
    paths = MlPaths(tmp_path)
    write_failure(
        paths, "no progress for 300 s: " + "é" * 2000 + " (reported to algo-2 by the leader algo-1)"
    )
    text = paths.failure_file.read_text(encoding="utf-8")
    # A cut between characters leaves at most 3 bytes unused on each side of the marker.
    assert FAILURE_LIMIT - 6 <= len(text.encode()) <= FAILURE_LIMIT
    assert text.startswith("no progress for 300 s: éé")
    assert text.endswith("éé (reported to algo-2 by the leader algo-1)")
    assert text.count(ELISION) == 1
    assert not list(paths.output_dir.glob("*.tmp"))


def test_a_long_rank_error_reaches_every_hosts_file_whole():
    """The longest reason a rank's report makes: TensorFlow's silent worker, the failing rank,
    a report of REPORT_LIMIT bytes and a worker's relay, with SageMaker's host names of a job
    of thousands of ranks and SDK 2 local mode's (`algo-1-x7k2p`): nothing is cut."""
    hosts = ["algo-1-x7k2p", "algo-1000-x7k2p"]
    error = ValueError("ü" * 3000)
    report = rank_failure(9999, hosts[1], error)
    assert REPORT_LIMIT - 6 <= len(report.error.encode()) <= REPORT_LIMIT
    log = log_of(
        f"[1,9999]<stderr>:The following tasks are unhealthy (stopped sending "
        f"heartbeats):\n[1,9999]<stderr>:/job:worker/replica:0/task:9998\n"
        f"[1,9999]<stderr>:{report.line()}\n"
    )
    outcome = relayed(summarize(log, 255, lambda rank: hosts[1]), hosts[0], hosts[1])
    assert outcome.reason.startswith(
        "TensorFlow worker 9998 (rank 9998 on host algo-1000-x7k2p) stopped sending heartbeats"
    )
    assert outcome.reason.endswith(
        f"{report.error} (reported to algo-1-x7k2p by the leader algo-1000-x7k2p)"
    )
    assert len(outcome.reason.encode()) <= FAILURE_LIMIT


def test_a_worker_relays_a_failure_after_its_root_cause_and_a_success_as_it_is():
    failed = Outcome.failed(FailureKind.RANK, "rank 1 on host algo-1 failed (exit code 1): X", 1)
    assert relayed(failed, "algo-2", "algo-1") == Outcome(
        FailureKind.RANK,
        "rank 1 on host algo-1 failed (exit code 1): X (reported to algo-2 by the leader algo-1)",
        1,
    )
    assert relayed(Outcome.success(), "algo-2", "algo-1") == Outcome.success()


def test_a_failure_file_on_a_full_or_broken_disk_is_reported_on_stderr(tmp_path, capsys):
    paths = MlPaths(tmp_path)
    paths.output_dir.parent.mkdir(parents=True, exist_ok=True)
    paths.output_dir.write_text("a file where the output folder should be")
    write_failure(paths, "rank 1 on host algo-2 failed")
    err = capsys.readouterr().err
    assert f"cannot write the failure file {paths.failure_file}" in err
    assert "the reason was: rank 1 on host algo-2 failed" in err


def test_a_worker_tensorflow_reports_silent_is_named_with_its_host_first():
    """The lines as TensorFlow 2.21's coordination service printed them on a real 2-host job
    whose worker on algo-2 was frozen with SIGSTOP (tests/image/test_tf_stack.py)."""
    log = log_of(
        "[1,0]<stderr>:tensorflow.python.framework.errors_impl.UnavailableError: Collective ops "
        "is aborted by: Error reported from /job:worker/task:1: The following tasks are "
        "unhealthy (stopped sending heartbeats):\n"
        "[1,0]<stderr>:/job:worker/replica:0/task:1\n"
        "[1,0]<stderr>:The tasks have crashed. Check the task logs for an earlier error\n"
        "[1,0]<stderr>:TRAIN-FAILURE rank=0 host=algo-1 kind=rank: UnavailableError: Graph "
        "execution error: Detected at node div_no_nan/CollectiveReduceV2\n"
    )
    hosts = ["algo-1", "algo-2"]
    outcome = summarize(log, 1, lambda rank: hosts[rank])
    assert outcome.reason.startswith(
        "TensorFlow worker 1 (rank 1 on host algo-2) stopped sending heartbeats: frozen, or its "
        "host is gone; rank 0 on host algo-1 failed (exit code 1): UnavailableError: Graph"
    )
    assert outcome.exit_code == 1
    assert not log_of(
        "[1,0]<stderr>:ValueError: /job:worker/replica:0/task:1 is bad\n"
    ).unhealthy_worker  # a worker named in another context is not blamed


def test_a_stop_line_is_remembered_however_much_the_ranks_print_after_it():
    """Eight ranks' shutdown warnings follow the leader's stop line; what it saved still
    reaches the failure file (a window of the last lines lost it)."""
    log = log_of(
        "[1,0]<stdout>:trainer: TRAIN-STOPPED checkpoint saved in /opt/ml/checkpoints; "
        "a restarted job resumes at epoch 2, step 48\n"
        + "".join(
            f"[1,{rank}]<stderr>:W0000 collective_ops.cc:42] cancelled\n" * 5 for rank in range(8)
        )
    )
    assert log.stopped == (
        "checkpoint saved in /opt/ml/checkpoints; a restarted job resumes at epoch 2, step 48"
    )
    assert log_of("[1,0]<stdout>:trainer: 2 rank(s)\n").stopped is None


KILLED = """--------------------------------------------------------------------------
mpirun noticed that process rank {rank} with PID 0 on node {host} exited on signal 9 (Killed).
--------------------------------------------------------------------------
"""
LIMIT = CgroupMemory(1, 3 * 2**30)


def test_a_rank_killed_on_this_host_is_out_of_memory_when_its_cgroup_counted_an_oom_kill():
    """Rank 0's host is the one mpirun runs on: its memory cgroup is this host's."""
    log = log_of(KILLED.format(rank=1, host="algo-1"))
    outcome = summarize(log, 137, host_of, memory=lambda: LIMIT)
    assert outcome == Outcome(
        FailureKind.RANK,
        f"rank 1 on host algo-1 was killed by signal 9 (Killed) - {killed(LIMIT, 'algo-1')}",
        137,
    )
    assert "algo-1's memory limit of 3.0 GiB" in outcome.reason
    assert "model_parallel=N" in outcome.reason
    likely = "rank 1 on host algo-1 was killed by signal 9 (Killed) - likely out of memory"
    assert summarize(log, 137, host_of, memory=lambda: None).reason == likely  # unreadable
    no_kill = CgroupMemory(0, 3 * 2**30)  # a SIGKILL someone else sent
    assert summarize(log, 137, host_of, memory=lambda: no_kill).reason == likely


def test_a_rank_killed_on_another_host_is_out_of_memory_when_that_hosts_cgroup_counted_one():
    """The leader asks the worker's launcher (container.coordination.Leader.memory_of): its
    answer, not this host's cgroup, decides; no answer leaves "likely"."""
    log = log_of(KILLED.format(rank=2, host="algo-2"))
    asked = []

    def memory_of(host):
        asked.append(host)
        return LIMIT

    outcome = summarize(log, 137, host_of, memory=lambda: None, memory_of=memory_of)
    assert outcome.reason == (
        f"rank 2 on host algo-2 was killed by signal 9 (Killed) - {killed(LIMIT, 'algo-2')}"
    )
    assert asked == ["algo-2"]
    assert "at algo-2's memory limit of 3.0 GiB (1 OOM kill counted in algo-2's memory cgroup)" in (
        outcome.reason
    )
    likely = "rank 2 on host algo-2 was killed by signal 9 (Killed) - likely out of memory"
    assert summarize(log, 137, host_of, memory=lambda: LIMIT).reason == likely  # not asked
    no_kill = CgroupMemory(0, 3 * 2**30)
    assert summarize(log, 137, host_of, memory_of=lambda host: no_kill).reason == likely


def test_a_worker_adds_that_it_ran_out_of_memory_to_its_copy():
    likely = Outcome.failed(
        FailureKind.RANK, "rank 1 on host algo-2 was killed by signal 9 (Killed) - likely...", 137
    )
    outcome = relayed(likely, "algo-2", "algo-1", memory=lambda: LIMIT)
    assert outcome.reason == (
        f"{likely.reason} (reported to algo-2 by the leader algo-1); "
        f"{host_ran_out('algo-2', LIMIT)}"
    )
    assert outcome.reason.endswith(ADVICE) and outcome.exit_code == 137
    assert relayed(likely, "algo-2", "algo-1", memory=lambda: None).reason == (
        f"{likely.reason} (reported to algo-2 by the leader algo-1)"
    )
    proven = summarize(log_of(KILLED.format(rank=0, host="algo-1")), 137, host_of, lambda: LIMIT)
    both = relayed(proven, "algo-2", "algo-1", memory=lambda: LIMIT).reason
    assert both.count(ADVICE) == 1 and "host algo-2 ran out of memory" in both


def test_a_worker_whose_kill_the_leader_proved_says_it_once():
    proven = summarize(
        log_of(KILLED.format(rank=2, host="algo-2")), 137, host_of, memory_of=lambda host: LIMIT
    )
    assert relayed(proven, "algo-2", "algo-1", memory=lambda: LIMIT).reason == (
        f"{proven.reason} (reported to algo-2 by the leader algo-1)"
    )
    success = Outcome.success()
    assert relayed(success, "algo-2", "algo-1", memory=lambda: LIMIT) == success


# mpirun's output when the kernel killed rank 1 on algo-2 and rank 0 lost it mid-collective
# (tests/image/test_memory_falls.py, one rank per host; the failure report shortened).
KILLED_MID_COLLECTIVE = """--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
[1,0]<stderr>:TRAIN-FAILURE rank=0 host=algo-1 kind=rank: JaxRuntimeError: UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [10.89.0.3]:29843 (at array.py, line 623: npy_value)
[1,0]<stderr>:jax.errors.JaxRuntimeError: UNKNOWN: Gloo AllGather failed: Connection closed by peer
--------------------------------------------------------------------------
mpirun noticed that process rank 1 with PID 19 on node algo-2 exited on signal 9 (Killed).
--------------------------------------------------------------------------
"""  # noqa: E501


def test_an_oom_kill_proven_on_another_host_comes_before_the_error_a_peer_reported_after_it():
    """The rank that lost its killed peer reports an error first; when the killed rank's host
    counted an OOM kill, the kill is the root cause, and the report only its consequence."""
    log = log_of(KILLED_MID_COLLECTIVE)
    outcome = summarize(log, 137, HOSTS.__getitem__, memory_of=lambda host: LIMIT)
    assert outcome == Outcome(
        FailureKind.RANK,
        (
            f"rank 1 on host algo-2 was killed by signal 9 (Killed) - {killed(LIMIT, 'algo-2')}; "
            "rank 0 on host algo-1 failed after it: JaxRuntimeError"
        ),
        137,
    )
    unproven = summarize(log, 137, HOSTS.__getitem__, memory_of=lambda host: None)
    assert unproven.reason.startswith(  # "likely" is no reason to doubt the rank's own report
        "rank 0 on host algo-1 failed (exit code 137): JaxRuntimeError: UNKNOWN: Gloo AllGather"
    )


def test_an_oom_kill_of_an_earlier_attempt_proves_nothing_about_a_later_sigkill(tmp_path):
    """max_restarts=1 on real processes (each attempt a program that says what mpirun says of
    a SIGKILL and exits as mpirun does), with this host's cgroup read as
    container.train_cli.supervise reads it: from each attempt's start. Attempt 1's kill was
    the OOM killer's (counted between its start and its end); attempt 2's was someone else's
    `kill -9` (no kill counted since it started, though the container's count is still 1)."""
    readings = iter([0, 1, 1, 1])  # attempt 1: start, end; attempt 2: start, end
    kills = []

    def read():
        kills.append(next(readings))
        return CgroupMemory(kills[-1], LIMIT.limit)

    killed_line = KILLED.format(rank=1, host="algo-1")
    program = [sys.executable, "-c", f"print({killed_line!r}, flush=True); exit(137)"]

    def attempt():
        memory = counting_from_now(read)
        return run_supervised(program, grace=5, host_of_rank=host_of, memory=memory)

    outcome = run_with_restarts(attempt, 1, tmp_path / "checkpoints", tmp_path)
    assert kills == [0, 1, 1, 1]
    first = json.loads((tmp_path / ATTEMPTS_FILE).read_text())[0]["reason"]
    assert first == (
        "rank 1 on host algo-1 was killed by signal 9 (Killed) - "
        f"{killed(CgroupMemory(1, LIMIT.limit), 'algo-1')}"
    )
    assert outcome.reason.startswith(
        "rank 1 on host algo-1 was killed by signal 9 (Killed) - likely out of memory (attempt 2"
    )
    assert outcome.exit_code == 137
