"""Turning a failed mpirun into one short, true sentence for /opt/ml/output/failure.

SageMaker shows the first 1024 characters of that file as the job's FailureReason, so it must
name the failing host, rank and exit code and that rank's last error line, not MPI_ABORT
boilerplate. Two sources feed it:

- the rank side prints one failure report when it fails (train.rank, in the format of
  job.protocol), which mpirun forwards to the leader tagged with the rank
  (`--tag-output`); it carries the kind of failure, which decides the exit code;
- mpirun's own messages say which process it saw die first, with what code or signal, and
  which daemon (host) it lost.

A host that vanished or could not be reached over ssh is a cluster failure; a rank that
died without a report (killed by a signal, `os._exit`) is a rank failure with mpirun's code;
one killed by SIGKILL is named out of memory for certain when its host's memory cgroup counted
an OOM kill (container.oom: the leader reads its own, and asks a worker's launcher for the
worker's over the coordinator), "likely" otherwise; only kills since the attempt started
count, since one of an earlier attempt proves nothing about this one (container.oom.since).
Everything here is pure text processing of mpirun's output and of what the cgroup files said
(read by the callables passed in: container.oom.counting_from_now for this host, the
coordinator's question for another), so it is tested against real mpirun output and real
cgroup files.

The budget, in bytes: a rank's report holds at most job.protocol.REPORT_LIMIT (600) bytes of
error, whose type, user's file and line and hint are never cut; `summarize` puts the failing
rank, host and exit code (and TensorFlow's silent worker) before it and `relayed` a worker's
leader after it, about 200 bytes with SageMaker's host names (`algo-12`), so a report reaches
the file whole. Whatever is longer still (a watchdog's reason over many ranks, a quoted
stderr line) loses its middle in `write_failure`, never its start or end.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from container.logs import log
from container.oom import ADVICE, CgroupMemory, counted_in, host_ran_out, killed
from job.checkpoint_folders import STATE, newest_usable
from job.paths import MlPaths
from job.protocol import (
    FailureKind,
    RankFailure,
    elide,
    exit_code,
    parse_rank_failure,
    parse_stopped,
)

FAILURE_LIMIT = 1024

_FRAME = re.compile(r"^-{20,}$")  # OpenMPI frames each help message with these
TAG = re.compile(r"^\[\d+,(?P<rank>\d+)\]<(?P<stream>stdout|stderr)>:(?P<text>.*)$")
_ABORT = re.compile(
    r"MPI_ABORT was invoked on rank (?P<rank>\d+) in communicator \S+\s+"
    r"with errorcode (?P<code>-?\d+)"
)
_EXITED = re.compile(r"Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]\s+Exit code:\s+(?P<code>-?\d+)")
_SIGNAL = re.compile(
    r"process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) exited on "
    r"signal (?P<signal>\d+)(?: \((?P<name>[^)]*)\))?"
)
_LOST = re.compile(r"Remote daemon: \[\[\d+,\d+\],\d+\] on node (?P<host>\S+)")
# TensorFlow's coordination service (MultiWorkerMirroredStrategy) lists a frozen or vanished
# worker after this phrase, on the same line or the next, by its task index, which is its rank
# (job.rank_job.RankJob.worker_environment).
_TF_HEARTBEATS = "stopped sending heartbeats"
_TF_TASK = re.compile(r"/job:worker/replica:\d+/task:(?P<task>\d+)")
_SSH = re.compile(
    r"ssh: (?:connect to host (?P<host>\S+)|Could not resolve hostname "
    r"(?P<unresolved>[^:\s]+))[^\n]*"
)


@dataclass(frozen=True)
class Outcome:
    """How a job ended: `kind` None on success; `reason` is what the failure file says."""

    kind: FailureKind | None
    reason: str
    exit_code: int

    @classmethod
    def success(cls) -> Outcome:
        return cls(None, "", 0)

    @classmethod
    def failed(cls, kind: FailureKind, reason: str, rank_code: int = 1) -> Outcome:
        return cls(kind, reason, exit_code(kind, rank_code))


@dataclass
class OutputLog:
    """What the supervisor remembers of mpirun's output while streaming it."""

    last_rank_error: dict[int, str] = field(default_factory=dict)
    reports: list[RankFailure] = field(default_factory=list)
    untagged: deque[str] = field(default_factory=lambda: deque(maxlen=400))
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    unhealthy_worker: int | None = None  # the first worker TensorFlow reported as silent
    stopped: str | None = None  # the last stop line's detail: what a stop saved, and where
    _heartbeats_reported: bool = False

    def add(self, line: str) -> None:
        line = line.rstrip("\n")
        self.tail.append(line)
        tagged = TAG.match(line)
        text = tagged["text"] if tagged else line
        self.stopped = parse_stopped(text) or self.stopped
        if _TF_HEARTBEATS in text or self._heartbeats_reported:
            self._heartbeats_reported = True
            task = _TF_TASK.search(text.partition(_TF_HEARTBEATS)[2] or text)
            if task and self.unhealthy_worker is None:
                self.unhealthy_worker = int(task["task"])
        report = parse_rank_failure(text)
        if report:
            self.reports.append(report)
        if not tagged:
            self.untagged.append(line)
        elif tagged["stream"] == "stderr" and _is_error_line(text):
            self.last_rank_error[int(tagged["rank"])] = text.strip()


def _is_error_line(text: str) -> bool:
    """A line worth quoting: an exception or error message, not a progress bar or warning."""
    stripped = text.strip()
    return bool(
        re.match(
            r"^[A-Za-z_.]*(Error|Exception|Exit|Interrupt)\b.*:|^Error\b|"
            r"^[A-Za-z_.]*Error$",
            stripped,
        )
    )


def summarize(
    log: OutputLog,
    exit_code: int,
    host_of_rank: Callable[[int], str],
    memory: Callable[[], CgroupMemory | None] = lambda: None,
    memory_of: Callable[[str], CgroupMemory | None] = lambda host: None,
) -> Outcome:
    """How a job whose mpirun exited with `exit_code` failed, and why. A rank killed by
    SIGKILL was out of memory for certain when its host's memory cgroup (container.oom)
    counted an OOM kill since the attempt started: `memory` reads this host's, the one mpirun
    runs on (rank 0's), and `memory_of(host)` learns another host's (None: unknown; on the
    leader of several hosts, container.coordination.Leader.memory_of asks that host's
    launcher, briefly). Neither reads a cgroup unless passed: a count since the container
    started could hold an earlier attempt's kill. A kill so
    proven is the root cause even when another rank reported an error: it lost that peer."""
    text = "\n".join(log.untagged)
    signal = _SIGNAL.search(text)
    proof = None  # why a rank killed by SIGKILL died, when its host's cgroup proves it
    if signal and signal["signal"] == "9":
        host = host_of_rank(int(signal["rank"]))
        proof = killed(memory() if host == host_of_rank(0) else memory_of(host), host)
    if log.reports:
        report = log.reports[0]
        if signal and proof and int(signal["rank"]) != report.rank:
            # The kernel's kill came first: a rank that reported an error lost that peer
            # (Gloo's or gRPC's "connection closed by peer"), and mpirun names both.
            return Outcome.failed(
                FailureKind.RANK,
                (
                    f"{_killed_by(signal, host_of_rank, proof, log)}; rank {report.rank} on "
                    f"host {report.host} failed after it: {report.error.partition(':')[0]}"
                ),
                exit_code,
            )
        code = _code_of(text, report.rank) or exit_code
        how = (
            f"exit code {code}" if report.kind is FailureKind.RANK else f"{report.kind.value} error"
        )
        reason = f"rank {report.rank} on host {report.host} failed ({how}): {report.error}"
        task = log.unhealthy_worker
        if task is not None:
            reason = (
                f"TensorFlow worker {task} (rank {task} on host {host_of_rank(task)}) "
                f"stopped sending heartbeats: frozen, or its host is gone; {reason}"
            )
        return Outcome.failed(report.kind, reason, code)
    lost = _LOST.search(text)
    if lost:
        return Outcome.failed(
            FailureKind.CLUSTER,
            (
                f"lost contact with host {lost['host']}: its MPI daemon vanished (host killed, out "
                f"of memory or network down); the job on every host was stopped"
            ),
        )
    if signal:
        return Outcome.failed(
            FailureKind.RANK, _killed_by(signal, host_of_rank, proof, log), exit_code
        )
    for pattern in (_ABORT, _EXITED):
        found = pattern.search(text)
        if found:
            rank = int(found["rank"])
            return Outcome.failed(
                FailureKind.RANK,
                (
                    f"rank {rank} on host {host_of_rank(rank)} exited with code "
                    f"{found['code']}{_last_error(log, rank)}"
                ),
                exit_code,
            )
    ssh = _SSH.search(text)
    if ssh:
        host = ssh["host"] or ssh["unresolved"]
        return Outcome.failed(
            FailureKind.CLUSTER,
            f"mpirun could not start ranks on host {host} over ssh: {ssh.group(0).strip()}",
        )
    message = openmpi_message(log.untagged)
    if message:
        return Outcome.failed(
            FailureKind.RANK,
            f"mpirun exited with code {exit_code}: OpenMPI says: {message}",
            exit_code,
        )
    last = next((line for line in reversed(log.tail) if line.strip()), "no output")
    return Outcome.failed(
        FailureKind.RANK,
        f"mpirun exited with code {exit_code}; last output: {last.strip()}",
        exit_code,
    )


def _killed_by(
    signal: re.Match[str], host_of_rank: Callable[[int], str], proof: str | None, log: OutputLog
) -> str:
    """Which rank a signal killed, where; for SIGKILL, out of memory for certain (`proof`) or
    likely; and that rank's last error line."""
    rank = int(signal["rank"])
    name = f" ({signal['name']})" if signal["name"] else ""
    hint = ""
    if signal["signal"] == "9":
        hint = f" - {proof}" if proof else " - likely out of memory"
    return (
        f"rank {rank} on host {host_of_rank(rank)} was killed by signal "
        f"{signal['signal']}{name}{hint}{_last_error(log, rank)}"
    )


def openmpi_message(lines: Iterable[str]) -> str | None:
    """The first of OpenMPI's framed help messages (between lines of dashes), as one line:
    the first one names the cause; those after it are its consequences."""
    block: list[str] | None = None
    for line in lines:
        if _FRAME.match(line):
            if block:
                return " ".join(block)
            block = []
        elif block is not None and line.strip():
            block.append(" ".join(line.split()))
    return None


def _code_of(text: str, rank: int) -> int | None:
    for pattern in (_ABORT, _EXITED):
        for found in pattern.finditer(text):
            if int(found["rank"]) == rank:
                return int(found["code"])
    return None


def _last_error(log: OutputLog, rank: int) -> str:
    error = log.last_rank_error.get(rank)
    return f": {error}" if error else ""


def restart_point(checkpoint_dir: Path) -> str:
    """Which checkpoint a restarted job resumes from, for a stop's reason when no rank confirmed
    a save: one saved before the stop (at an epoch's end, a moment before it) is not lost work.
    Picked by job.checkpoint_folders.newest_usable, as the restarted job's rank 0 picks it."""
    found = newest_usable(checkpoint_dir)
    if found is None:
        return f"there is no checkpoint in {checkpoint_dir}: a restarted job starts afresh"
    folder, state = found
    where = [f"epoch {state['epochs_done']}"]
    if isinstance(state.get("step"), int):  # train.resumable's; the trainer counts samples
        where.append(f"step {state['step']}")
    try:
        where.append(f"saved {max(0.0, time.time() - (folder / STATE).stat().st_mtime):.0f} s ago")
    except OSError:  # pruned or synced away since: the folder is still the one picked
        pass
    return f"a restarted job resumes from {folder} ({', '.join(where)})"


def relayed(
    outcome: Outcome,
    host: str,
    leader: str,
    memory: Callable[[], CgroupMemory | None] = lambda: None,
) -> Outcome:
    """A worker's copy of the leader's outcome: the root cause first, since SageMaker may show
    any host's failure file, then which host relayed it; then, when this host's memory cgroup
    (`memory`, container.oom) counted an OOM kill that the leader's reason does not already
    name, that this host ran out of memory (a process other than a rank was killed, or the
    leader could not hear this host's answer in time and said "likely"); `memory` counts from
    the launcher's start (container.oom.counting_from_now: a worker is not told of restarts),
    and nothing is read unless it is passed."""
    if outcome.kind is None:
        return outcome
    reason = f"{outcome.reason} (reported to {host} by the leader {leader})"
    if counted_in(host) in outcome.reason:
        return replace(outcome, reason=reason)
    own = host_ran_out(host, memory(), advise=ADVICE not in outcome.reason)
    return replace(outcome, reason=f"{reason}; {own}" if own else reason)


def write_failure(paths: MlPaths, message: str) -> None:
    """Write the reason SageMaker shows; the limit is SageMaker's, so cut to it, keeping the
    start (the root cause) and the end (where, the hint, who relayed it).

    A failure file that cannot be written (read-only or full disk) must not change the job's
    exit code: the reason goes to stderr, which SageMaker keeps in the job's log.
    """
    text = elide(message, FAILURE_LIMIT)
    temporary = paths.failure_file.with_suffix(".tmp")
    try:
        paths.output_dir.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(paths.failure_file)
    except OSError as error:
        log.error(
            f"cannot write the failure file {paths.failure_file} "
            f"({error.strerror or error}); the reason was: {message}"
        )
