"""Running mpirun (or a data host's program): stream its output, forward stop signals, and
say how it ended.

Output: each rank's lines are put back together (container.lines) before they are logged,
read for failure reports (container.failure) or watched (container.watchdog).

Stopping: SageMaker sends SIGTERM and kills everything 120 s later. The launcher turns the
first SIGTERM into SIGUSR1 for mpirun, which forwards it to every rank; the trainer then
agrees with the other ranks to stop after the current step, saves a checkpoint and exits.
If the ranks are not done after `stop_grace` seconds, they are asked for their stacks (as the
watchdog does: where they are stuck is then in the log), and mpirun gets SIGTERM (it kills the
job) and, 10 s later, SIGKILL, as does every process the job started (container.session: a
rank's helper processes too, which would otherwise hold mpirun open). A second SIGTERM skips
the wait. The failure file says whether a checkpoint was confirmed, and if not, why (the
grace ran out, or a rank failed) and which checkpoint a restart resumes from: one saved
before the stop is not lost.

Hanging: with a `ProgressWatch` (container.watchdog), a thread checks once a second whether
the ranks still make progress; when they do not, it asks them for their stacks (SIGUSR2,
which mpirun forwards like SIGUSR1), waits a few seconds for them to print, and stops mpirun
the same way; the job then fails as hung, whatever mpirun's own exit says.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from container.failure import Outcome, OutputLog, restart_point, summarize
from container.lines import WholeLines
from container.logs import log
from container.oom import CgroupMemory
from container.session import Session
from container.watchdog import STACK_GRACE, ProgressWatch
from job.protocol import FailureKind, parse_active

# What signal.signal takes and gives back: a function, SIG_DFL or SIG_IGN, or None (a handler
# not set from Python)
SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class StopSignals:
    """Installs the SIGTERM/SIGINT handler for the duration of one mpirun (or data host's
    program: with `forward` off, the stop is not passed on, container.data_host)."""

    def __init__(self, session: Session, grace: float, forward: bool = True):
        self.session = session
        self.process = session.process
        self.grace = grace
        self.forward = forward
        self.received = threading.Event()
        self.overdue = False  # the ranks were still running `grace` s after the stop
        self.previous: dict[signal.Signals, SignalHandler] = {}

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received.is_set():
            self.escalate()
            return
        self.received.set()
        name = signal.Signals(signum).name
        if self.forward:
            log.info(
                f"received {name}; asking the ranks to save a checkpoint and stop "
                f"(grace {self.grace:g} s)"
            )
            self.session.signal_program(signal.SIGUSR1)
        else:
            log.info(
                f"received {name}; {self.session.name} runs on until the ranks "
                f"have saved their checkpoint and the leader reports the job's end (grace "
                f"{self.grace:g} s)"
            )
        threading.Thread(target=self._deadline, daemon=True).start()

    def _deadline(self) -> None:
        try:
            self.process.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self.overdue = True
            if not self.forward:  # no ranks here to ask for their stacks
                self.escalate(f"no end of the job reported within the grace of {self.grace:g} s")
                return
            log.info(
                f"the ranks did not stop within the grace of {self.grace:g} s; "
                "asking every rank for its Python stack, then stopping the job"
            )
            self.stacks_then_escalate()

    def stacks_then_escalate(self) -> None:
        """Every rank prints its Python stack (SIGUSR2, which mpirun forwards: faulthandler in
        train.rank), then the job is ended."""
        self.session.signal_program(signal.SIGUSR2)
        try:
            self.process.wait(timeout=STACK_GRACE)
        except subprocess.TimeoutExpired:
            self.escalate()

    def escalate(self, why: str = "ranks did not stop in time") -> None:
        """End the program and every process it started (container.session)."""
        self.session.end(why)


def run_supervised(
    argv: list[str],
    *,
    grace: float,
    host_of_rank: Callable[[int], str],
    env: dict[str, str] | None = None,
    watch: ProgressWatch | None = None,
    abort: threading.Event | None = None,
    checkpoint_dir: Path | None = None,
    forward_stop: bool = True,
    memory: Callable[[], CgroupMemory | None] = lambda: None,
    memory_of: Callable[[str], CgroupMemory | None] = lambda host: None,
) -> Outcome:
    """Run mpirun (or a data host's program) to the end in a session of its own
    (container.session), echoing its output; the outcome says who failed and why.
    `abort`, once set, ends it at once (the job failed elsewhere: a data host);
    `forward_stop` off: a stop is not passed on to the program, which runs on until `abort`
    or the grace ends it (a data host's, container.data_host);
    `checkpoint_dir`: where a stop's reason looks for the checkpoint a restart resumes from;
    `memory()`, `memory_of(host)`: this host's and another host's memory cgroup, counted since
    this attempt started, which say whether a rank killed there was out of memory
    (container.failure.summarize)."""
    output_log, lines = OutputLog(), WholeLines()

    def take(line: str) -> None:
        """One whole line: the watchdog's, or the log's (pulses go nowhere with the watchdog
        off)."""
        swallowed = watch.observe(line) if watch is not None else parse_active(line) is not None
        if swallowed:
            return
        sys.stdout.write(line + "\n")
        output_log.add(line)

    session = Session(argv, env)
    process = session.process
    with StopSignals(session, grace, forward_stop) as stops:
        if watch is not None:
            threading.Thread(target=_watchdog, args=(process, watch, stops), daemon=True).start()
        if abort is not None:
            threading.Thread(target=_aborter, args=(process, abort, stops), daemon=True).start()
        for output_line in session.output():
            for line in lines.feed(output_line):
                take(line)
        exit_code = process.wait()
        for line in lines.rest():
            take(line)
    sys.stdout.flush()
    if watch is not None and watch.silence is not None:
        return Outcome.failed(FailureKind.HUNG, watch.reason())
    stopped = stops.received.is_set()
    if exit_code == 0 and not stopped:
        return Outcome.success()
    if stopped:
        detail = stop_detail(output_log, exit_code, stops, host_of_rank, checkpoint_dir, memory)
        return Outcome.failed(
            FailureKind.STOPPED,
            f"training was stopped by a signal (job "
            f"stopped, max runtime or spot reclaim); {detail}",
        )
    return summarize(output_log, exit_code, host_of_rank, memory, memory_of)


def stop_detail(
    log: OutputLog,
    exit_code: int,
    stops: StopSignals,
    host_of_rank: Callable[[int], str],
    checkpoint_dir: Path | None = None,
    memory: Callable[[], CgroupMemory | None] = lambda: None,
) -> str:
    """What the ranks confirmed they saved after a stop; else why nothing was confirmed, and
    the checkpoint a restart resumes from (saved before the stop: a script stopped after its
    `fit` returned, or one whose save failed or outlasted the grace, may still lose nothing)."""
    if log.stopped is not None:
        return log.stopped
    if stops.overdue:
        why = (
            f"no checkpoint was confirmed within the grace of {stops.grace:g} s, so the "
            "ranks were killed; their Python stacks are in the log: raise stop_grace if "
            "saving takes longer"
        )
    elif exit_code != 0 and log.reports:
        failed = summarize(log, exit_code, host_of_rank, memory)
        why = f"no checkpoint was confirmed: {failed.reason}"
    else:
        why = "no checkpoint was confirmed at the stop"
    return why if checkpoint_dir is None else f"{why}; {restart_point(checkpoint_dir)}"


def _aborter(process: subprocess.Popen[str], abort: threading.Event, stops: StopSignals) -> None:
    while process.poll() is None:
        if abort.wait(0.5):
            stops.escalate("the job ended on another host")
            return


def _watchdog(process: subprocess.Popen[str], watch: ProgressWatch, stops: StopSignals) -> None:
    while process.poll() is None and not stops.received.is_set():
        silence = watch.overdue()
        if silence is None:
            time.sleep(1.0)
            continue
        log.info(
            f"no progress for {silence:.0f} s; asking every rank for its Python "
            "stack, then stopping the job"
        )
        watch.fire(silence)
        stops.stacks_then_escalate()
        return
