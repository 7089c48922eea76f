"""The progress watchdog: a job whose ranks stop working ends as a named failure.

A hung distributed job (a dead mount, a deadlocked loader, one rank stuck while the others
wait in a collective) otherwise bills until SageMaker's max runtime. The supervisor feeds
every line mpirun forwards (whole: container.lines) to a `ProgressWatch`, which remembers when
each rank last showed that it works:

- progress: `TRAIN-PROGRESS step=N` after each optimizer step (the built-in trainer, the
  helper's callbacks) or without a step (`distributed.heartbeat()`), and in script mode any
  line a rank prints on stdout. Not stderr: TensorFlow and Horovod keep warning there while a
  job hangs (Horovod's stall check, every 30 s as container.plan sets it);
- activity: `TRAIN-ACTIVE cpu=N`, the pulse of a rank that used the CPU (train.activity), so
  that a long epoch, a script that prints once an epoch, or a leader evaluating or saving alone
  is never taken for a hang, whatever it prints;
- waiting on I/O: `TRAIN-ACTIVE cpu=N io=network` (or `io=disk`), the pulse of a rank whose
  main thread is blocked on a socket or a file (a slow HTTP call, a slow read), which counts
  as activity for IO_WAIT_LIMIT seconds of one wait: a slow call is not a hang, a call that
  never returns (a dead server, a dead mount) still is, the rank named as waiting on the
  network or the disk.

The one arbiter of a hang is this watch; Horovod's own stall shutdown is off (container.plan).
It fires in two cases:
1. No rank has made progress or shown activity for `progress_timeout` seconds
   (`first_progress_timeout` before the first progress: data counting and compilation take a
   while, and a download may not use the CPU). Both are at least
   job.launch_config.MIN_PROGRESS_TIMEOUT (120 s), twice the quiet of a healthy `fit` as it
   returns: shorter ones are refused when the job's hyperparameters are validated.
2. Horovod's stall check names ranks the others wait for in a collective, and those ranks have
   shown no progress or activity for as long as the stall check's own period
   (container.plan.STALL_CHECK_SECONDS, 30 s; Horovod's default is 60 s): the check looks once
   a period, so a rank that never comes is named about a minute after the others began to
   wait, whatever the first-progress allowance, while a rank the others wait for because it
   works alone is left to work.
Then the supervisor asks every rank for its Python stack (SIGUSR2 through mpirun;
train.rank installs faulthandler for it), gives them a few seconds to print, and stops the
job. The failure reason names each rank's last step and where its stack stood, grouped, plus
what Horovod's stall check said about missing ranks and tensors.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from container.failure import TAG
from job.launch_config import LaunchConfig
from job.protocol import LIBRARY_PATHS, PULSE_SECONDS, parse_active, parse_progress, parse_waiting

STACK_GRACE = 5.0  # seconds the ranks get to print their stacks before the job is stopped
# The longest one wait of a rank on the network or the disk counts as activity: longer than a
# slow tracking server or S3 call with its retries (MLflow's client retries for minutes), short
# enough that a call to a dead server ends as hung within the hour.
IO_WAIT_LIMIT = 600.0
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
_MISSING = re.compile(r"^\s*(?P<ranks>\d+(?:, ?\d+)*): \[(?P<tensors>[^\]]*)\]")


@dataclass
class ProgressWatch:
    """What the watchdog knows of a running job; fed line by line, asked once a second.
    `straggler_timeout` is the period of Horovod's stall check (None: no such check)."""

    timeout: float
    first_timeout: float
    script_mode: bool
    host_of_rank: Callable[[int], str]
    world_size: int
    straggler_timeout: float | None = None
    clock: Callable[[], float] = time.monotonic
    started: float = 0.0
    last_progress: float | None = None
    last_active: dict[int, float] = field(default_factory=dict)  # progress or activity
    steps: dict[int, int] = field(default_factory=dict)
    stacks: dict[int, list[str]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)  # Horovod: which ranks never submitted what
    waited_for: set[int] = field(default_factory=set)  # the ranks of its latest report
    in_missing: bool = False  # the lines that follow Horovod's "Missing ranks:"
    stragglers: list[int] = field(default_factory=list)  # when case 2 fired: the ranks waited for
    io_waits: dict[int, tuple[str, float]] = field(default_factory=dict)  # rank: (on what, since)
    silence: float | None = None  # set when the watchdog fired: seconds without progress

    def __post_init__(self) -> None:
        self.started = self.clock()

    @classmethod
    def of(
        cls,
        launch: LaunchConfig,
        script_mode: bool,
        host_of_rank: Callable[[int], str],
        world_size: int,
        straggler_timeout: float | None = None,
    ) -> ProgressWatch | None:
        """The job's watch; None when `progress_timeout` is 0 (the watchdog is off)."""
        if not launch.progress_timeout:
            return None
        return cls(
            launch.progress_timeout,
            launch.first_progress_timeout,
            script_mode,
            host_of_rank,
            world_size,
            straggler_timeout,
        )

    def observe(self, line: str) -> bool:
        """Take one whole line of mpirun's output; True when it is a progress or activity line,
        which the supervisor does not echo (one per rank every few seconds would drown the
        log)."""
        tagged = TAG.match(line.rstrip("\n"))
        if not tagged:
            return False
        rank, text = int(tagged["rank"]), tagged["text"]
        progress, step = parse_progress(text)
        if progress or parse_active(text) is not None:
            if self.silence is None:  # what ranks do while they are being stopped is moot
                waiting = None if progress else parse_waiting(text)
                if waiting is None:
                    self.io_waits.pop(rank, None)
                    self._working(rank, progress)
                elif self._may_wait(rank, waiting):
                    self._working(rank, progress=False)
                if step is not None:
                    self.steps[rank] = step
            return True
        if tagged["stream"] == "stderr":
            self._read_stall_check(text)
            if self.silence is not None:
                self.stacks.setdefault(rank, []).append(text)
        elif self.script_mode and self.silence is None:
            self._working(rank, progress=True)
        return False

    def _working(self, rank: int, progress: bool) -> None:
        now = self.clock()
        self.last_active[rank] = now
        if progress:
            self.last_progress = now
        self.waited_for.discard(rank)  # it is not the one holding the others up

    def _may_wait(self, rank: int, waiting: str) -> bool:
        """Whether this wait on I/O still counts as activity: for IO_WAIT_LIMIT seconds."""
        since = self.io_waits.setdefault(rank, (waiting, self.clock()))[1]
        return self.clock() - since <= IO_WAIT_LIMIT

    def _read_stall_check(self, text: str) -> None:
        """Horovod's stall check: `Missing ranks:`, then one line per group of ranks."""
        if "Missing ranks:" in text:
            self.in_missing, self.missing = True, []
            self.waited_for = set()
        elif self.in_missing and (found := _MISSING.match(text)):
            self.missing.append(f"rank(s) {found['ranks']} never submitted {found['tensors']}")
            self.waited_for |= {int(rank) for rank in found["ranks"].split(",")}
        else:
            self.in_missing = False

    def _limit(self) -> tuple[str, float]:
        """The allowance in force: before the first progress, or after it."""
        if self.last_progress is None:
            return "first_progress_timeout", self.first_timeout
        return "progress_timeout", self.timeout

    def _idle(self, rank: int) -> float:
        return self.clock() - self.last_active.get(rank, self.started)

    def overdue(self) -> float | None:
        """Seconds without progress or activity (case 1), or the idle seconds of the ranks the
        others wait for (case 2), when that is past its limit; else None."""
        stragglers = sorted(self.waited_for)
        if stragglers and self.straggler_timeout is not None:
            idle = min(self._idle(rank) for rank in stragglers)
            # a working rank's pulses come PULSE_SECONDS apart: never call one idle sooner
            if idle >= max(self.straggler_timeout, 3 * PULSE_SECONDS):
                self.stragglers = stragglers
                return idle
        since = max([self.started, *self.last_active.values()])
        quiet = self.clock() - since
        return quiet if quiet >= self._limit()[1] else None

    def fire(self, silence: float) -> None:
        """From now on stderr lines are the ranks' stacks."""
        self.silence = silence

    def reason(self) -> str:
        """The failure file's sentence: how long, each rank's step and place, Horovod's word."""
        groups: dict[str, list[int]] = {}
        for rank in range(self.world_size):
            step = self.steps.get(rank)
            done = f"last finished step {step}" if step is not None else "finished no step"
            if rank in self.io_waits:
                kind, since = self.io_waits[rank]
                done += (
                    f", waiting on the {kind} for {self.clock() - since:.0f} s (a wait on "
                    f"I/O counts as work for {IO_WAIT_LIMIT:g} s)"
                )
            groups.setdefault(f"{done}, {where(self.stacks.get(rank, []))}", []).append(rank)
        ranks = "; ".join(
            f"{_ranks(members, self.host_of_rank)} {state}" for state, members in groups.items()
        )
        horovod = f". Horovod's stall check: {'; '.join(self.missing)}" if self.missing else ""
        if self.stragglers:
            whom = _ranks(self.stragglers, self.host_of_rank)
            return (
                f"{whom} did nothing for {self.silence or 0:.0f} s while the other ranks "
                f"waited for {'it' if len(self.stragglers) == 1 else 'them'} in a "
                f"collective (Horovod's stall check, every {self.straggler_timeout:g} s): "
                f"{ranks}{horovod}. Every rank's Python stack is in the log"
            )
        limit, limit_value = self._limit()
        before = "" if self.last_progress is not None else " (none since the start)"
        return (
            f"no progress for {self.silence or 0:.0f} s ({limit} {limit_value:g} s)"
            f"{before}: {ranks}{horovod}. Every rank's Python stack is in the log"
        )


def _ranks(members: list[int], host_of_rank: Callable[[int], str]) -> str:
    hosts = sorted({host_of_rank(rank) for rank in members})
    label = "rank" if len(members) == 1 else "ranks"
    return f"{label} {', '.join(map(str, members))} on {', '.join(hosts)}"


def where(stack: list[str]) -> str:
    """Where one rank's main thread stood, from its faulthandler dump: the innermost frame,
    and the innermost frame of the user's own code when that is another."""
    blocks: list[list[re.Match[str]]] = []
    for line in stack:
        if _THREAD.match(line):
            blocks.append([])
        elif blocks and (frame := _FRAME.match(line)):
            blocks[-1].append(frame)
    main = [
        block
        for block in blocks  # the outermost frame of the main thread
        if block and block[-1]["function"] in ("<module>", "_run_module_as_main")
    ]
    frames = main[0] if main else (blocks[0] if blocks and blocks[0] else None)
    if frames is None:
        return "gave no stack (stopped, or stuck outside Python)"
    inner = frames[0]
    text = f"in {inner['function']} ({Path(inner['file']).name}:{inner['line']})"
    own = next(
        (
            frame
            for frame in frames
            if not frame["file"].startswith(LIBRARY_PATHS) and not frame["file"].startswith("<")
        ),
        None,
    )
    if own is not None and own is not inner:
        text += f" from {Path(own['file']).name}:{own['line']}"
    return text
