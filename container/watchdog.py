"""The progress watchdog: a job whose ranks stop making progress ends as a named failure.

A hung distributed job (a dead mount, a deadlocked loader, one rank stuck while the others
wait in a collective) otherwise bills until SageMaker's max runtime. The supervisor feeds
every line mpirun forwards to a `ProgressWatch`, which remembers when each rank last made
progress:

- the built-in trainer: `TRAIN-PROGRESS step=N` after each optimizer step (train.progress);
- script mode: the same lines (`distributed.heartbeat()`, or the helper's callbacks), and
  any line a rank prints on stdout. Not stderr: TensorFlow and Horovod keep warning there
  while a job hangs (Horovod's stall check every 60 s).

When no rank has made progress for `progress_timeout` seconds (`first_progress_timeout`
before the first progress: data counting and compilation take a while), the supervisor asks
every rank for its Python stack (SIGUSR2 through mpirun; train.rank installs faulthandler for
it), gives them a few seconds to print, and stops the job. The failure reason names each
rank's last step and where its stack stood, grouped, plus what Horovod's stall check said
about missing ranks and tensors.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from container.failure import TAG
from job.launch_config import LaunchConfig
from job.protocol import LIBRARY_PATHS, parse_progress

STACK_GRACE = 5.0  # seconds the ranks get to print their stacks before the job is stopped
# faulthandler writes a line in several pieces, and mpirun tags each piece it reads, so one
# line of its output can hold pieces of several ranks' lines, each after its own tag
_ANY_TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr)>:")
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
_MISSING = re.compile(r"^\s*(?P<ranks>\d+(?:, ?\d+)*): \[(?P<tensors>[^\]]*)\]")


@dataclass
class ProgressWatch:
    """What the watchdog knows of a running job; fed line by line, asked once a second."""

    timeout: float
    first_timeout: float
    script_mode: bool
    host_of_rank: Callable[[int], str]
    world_size: int
    clock: Callable[[], float] = time.monotonic
    started: float = 0.0
    last_progress: float | None = None
    steps: dict[int, int] = field(default_factory=dict)
    stacks: dict[int, list[str]] = field(default_factory=dict)
    missing: str = ""  # Horovod's stall check: which ranks never submitted which tensor
    after_missing: bool = False  # the last line was Horovod's "Missing ranks:"
    pieces: dict[tuple[int, str], str] = field(default_factory=dict)  # unfinished lines
    silence: float | None = None  # set when the watchdog fired: seconds without progress

    def __post_init__(self) -> None:
        self.started = self.clock()

    @classmethod
    def of(cls, launch: LaunchConfig, script_mode: bool, host_of_rank: Callable[[int], str],
           world_size: int) -> "ProgressWatch | None":
        """The job's watch; None when `progress_timeout` is 0 (the watchdog is off)."""
        if not launch.progress_timeout:
            return None
        return cls(launch.progress_timeout, launch.first_progress_timeout, script_mode,
                   host_of_rank, world_size)

    def observe(self, line: str) -> bool:
        """Take one line of mpirun's output; True when it is a progress line, which the
        supervisor does not echo (one per rank per second would drown the log)."""
        line = line.rstrip("\n")
        tagged = TAG.match(line)
        if not tagged:
            return False
        rank, text = int(tagged["rank"]), tagged["text"]
        progress, step = parse_progress(text)
        if progress:
            if self.silence is None:  # what ranks finish while they are being stopped is moot
                self.last_progress = self.clock()
                if step is not None:
                    self.steps[rank] = step
            return True
        if self.silence is not None:
            self._collect_stacks(line)
            return False
        if tagged["stream"] == "stdout":
            if self.script_mode:
                self.last_progress = self.clock()
        elif "Missing ranks:" in text:
            self.after_missing = True
        elif self.after_missing and (found := _MISSING.match(text)):
            self.missing = f"rank(s) {found['ranks']} never submitted {found['tensors']}"
            self.after_missing = False
        return False

    def _collect_stacks(self, line: str) -> None:
        """Reassemble each rank's stderr lines from the tagged pieces of one output line: a
        piece ends its rank's line only when it ends the output line."""
        parts = _ANY_TAG.split(line)[1:]  # rank, stream, text, rank, stream, text, ...
        for index in range(0, len(parts), 3):
            stream = (int(parts[index]), parts[index + 1])
            self.pieces[stream] = self.pieces.get(stream, "") + parts[index + 2]
            if index == len(parts) - 3:
                text = self.pieces.pop(stream)
                if stream[1] == "stderr":
                    self.stacks.setdefault(stream[0], []).append(text)

    def _limit(self) -> tuple[str, float]:
        """The allowance in force: before the first progress, or after it."""
        if self.last_progress is None:
            return "first_progress_timeout", self.first_timeout
        return "progress_timeout", self.timeout

    def overdue(self) -> float | None:
        """Seconds without progress, when that is past the limit; else None."""
        since = self.last_progress if self.last_progress is not None else self.started
        quiet = self.clock() - since
        return quiet if quiet >= self._limit()[1] else None

    def fire(self, silence: float) -> None:
        """From now on stderr lines are the ranks' stacks."""
        self.silence = silence

    def reason(self) -> str:
        """The failure file's sentence: how long, each rank's step and place, Horovod's word."""
        limit, limit_value = self._limit()
        before = "" if self.last_progress is not None else " (none since the start)"
        groups: dict[str, list[int]] = {}
        for rank in range(self.world_size):
            step = self.steps.get(rank)
            done = f"last finished step {step}" if step is not None else "finished no step"
            groups.setdefault(f"{done}, {where(self.stacks.get(rank, []))}", []).append(rank)
        ranks = "; ".join(f"{_ranks(members, self.host_of_rank)} {state}"
                          for state, members in groups.items())
        horovod = f". Horovod's stall check: {self.missing}" if self.missing else ""
        return (f"no progress for {self.silence or 0:.0f} s ({limit} {limit_value:g} s)"
                f"{before}: {ranks}{horovod}. Every rank's Python stack is in the log")


def _ranks(members: list[int], host_of_rank: Callable[[int], str]) -> str:
    hosts = sorted({host_of_rank(rank) for rank in members})
    label = "rank" if len(members) == 1 else "ranks"
    return f"{label} {', '.join(map(str, members))} on {', '.join(hosts)}"


def where(stack: list[str]) -> str:
    """Where one rank's main thread stood, from its faulthandler dump: the innermost frame,
    and the innermost frame of the user's own code when that is another."""
    blocks: list[list[re.Match]] = []
    for line in stack:
        if _THREAD.match(line):
            blocks.append([])
        elif blocks and (frame := _FRAME.match(line)):
            blocks[-1].append(frame)
    main = [block for block in blocks  # the outermost frame of the main thread
            if block and block[-1]["function"] in ("<module>", "_run_module_as_main")]
    frames = main[0] if main else (blocks[0] if blocks and blocks[0] else None)
    if frames is None:
        return "gave no stack (stopped, or stuck outside Python)"
    inner = frames[0]
    text = f"in {inner['function']} ({Path(inner['file']).name}:{inner['line']})"
    own = next((frame for frame in frames if not frame["file"].startswith(LIBRARY_PATHS)
                and not frame["file"].startswith("<")), None)
    if own is not None and own is not inner:
        text += f" from {Path(own['file']).name}:{own['line']}"
    return text
