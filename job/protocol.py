"""The lines ranks and the launcher exchange through mpirun's output, in one place.

Ranks talk to the launcher only by printing; mpirun forwards each line, maybe prefixed with
its tag (`[1,0]<stdout>:`), so every parser here searches inside a line. The lines:

    METRICS epoch=3 loss=0.1234 accuracy=0.95 lr=0.0016      rank 0, once per epoch
    TRAIN-FAILURE rank=1 host=algo-2 kind=config: DataError: ...   a rank about to die
    TRAIN-STOPPED checkpoint saved in ...                    rank 0, after a requested stop
    TRAIN-MARK hosts_ready                                   a timing mark (launcher, rank 0)
    TRAIN-PROGRESS step=412                                  a rank finished a step (or a
                                                             script's heartbeat); the
                                                             launcher's watchdog reads these
    TRAIN-ACTIVE cpu=0.93                                    a rank computed (cores of CPU
                                                             over its last pulse; on stderr)
    TRAIN-ACTIVE cpu=0.00 io=network                         a rank computed little: its main
                                                             thread waits on the network (or
                                                             the disk), not on a peer or a lock

The failure report carries the kind of failure (`FailureKind`), so a configuration or data
error raised inside a rank ends the job with the configuration exit code on every host, and
`exit_code` is the one mapping of kinds to exit codes. Dependency-free on purpose: the
launcher (container/), the rank programs (train/) and the operator tool (sagemaker_ops/)
all import it.
"""

from __future__ import annotations

import math
import re
import sysconfig
import traceback
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from job.hints import hint_for

METRICS_PREFIX = "METRICS"
FAILURE_MARKER = "TRAIN-FAILURE"
STOPPED_MARKER = "TRAIN-STOPPED"
TIME_MARKER = "TRAIN-MARK"
PROGRESS_MARKER = "TRAIN-PROGRESS"
ACTIVE_MARKER = "TRAIN-ACTIVE"
# Bytes of the error in a failure report: SageMaker shows 1024 bytes of the failure file, and
# container.failure adds the failing host, rank and exit code before it (and a worker the
# leader's name after it) within the rest.
REPORT_LIMIT = 600
SOURCE_LIMIT = 120  # bytes of the failing source line quoted in a report
ELISION = " ... "  # marks the middle of a text cut to fit


class FailureKind(Enum):
    """Why a job failed; `exit_code` maps each kind to the code the job exits with."""

    CONFIG = "config"  # configuration or data: the user's to fix
    CLUSTER = "cluster"  # a host, sshd, the network or the leader/worker protocol
    RANK = "rank"  # a rank program failed: its own exit code
    STOPPED = "stopped"  # a stop signal (job stopped, max runtime, spot reclaim)
    HUNG = "hung"  # no rank made progress for progress_timeout seconds
    INTERNAL = "internal"  # a bug in the launcher


def exit_code(kind: FailureKind, rank_code: int = 1) -> int:
    """The exit code of a job that failed for `kind`; `rank_code` is the failed rank's own."""
    codes = {
        FailureKind.CONFIG: 2,
        FailureKind.CLUSTER: 3,
        FailureKind.HUNG: 4,
        FailureKind.STOPPED: 143,
        FailureKind.INTERNAL: 1,
    }
    return codes.get(kind, rank_code or 1)


class Mark(Enum):
    """Moments of a run that benchmarks time, printed as `TRAIN-MARK <name>`."""

    HOSTS_READY = "hosts_ready"  # launcher: every host is ready, mpirun starts
    RANKS_UP = "ranks_up"  # rank 0: Horovod is up on every rank
    DATA_READ = "data_read"  # rank 0: the training data is loaded
    MODEL_EXPORTED = "model_exported"  # rank 0: the model is written
    JOB_DONE = "job_done"  # launcher: mpirun ended, the job completed


def mark_line(mark: Mark) -> str:
    return f"{TIME_MARKER} {mark.value}"


_MARK = re.compile(re.escape(TIME_MARKER) + r" (?P<name>\w+)\s*$")


def parse_mark(line: str) -> Mark | None:
    found = _MARK.search(line)
    try:
        return Mark(found["name"]) if found else None
    except ValueError:
        return None


def progress_line(step: int | None) -> str:
    """A rank's sign of life: the optimizer step it finished, or a heartbeat (no step)."""
    return f"{PROGRESS_MARKER}" + (f" step={step}" if step is not None else "")


# Numbers of at most 18 digits: int() refuses more than 4300, and no step or rank has 19.
_PROGRESS = re.compile(re.escape(PROGRESS_MARKER) + r"(?: step=(?P<step>\d{1,18}))?\s*$")


def parse_progress(line: str) -> tuple[bool, int | None]:
    """(is it a progress line, the step it names) of a line, maybe tagged."""
    found = _PROGRESS.search(line)
    return (True, int(found["step"]) if found["step"] else None) if found else (False, None)


PULSE_SECONDS = 2.0  # how often a rank that computes says so (train.activity)


IO_WAITS = ("network", "disk")  # what a rank's main thread may be waiting on (train.activity)


def active_line(cores: float, waiting: str | None = None) -> str:
    """A rank's pulse: it used `cores` of CPU on average since its last pulse, and its main
    thread is `waiting` on one of IO_WAITS (None: it is not, or it computed)."""
    return f"{ACTIVE_MARKER} cpu={cores:.2f}" + (f" io={waiting}" if waiting else "")


_ACTIVE = re.compile(
    re.escape(ACTIVE_MARKER) + r" cpu=(?P<cores>\d+(?:\.\d+)?)"
    r"(?: io=(?P<io>" + "|".join(IO_WAITS) + r"))?\s*$"
)


def parse_active(line: str) -> float | None:
    """The cores of a pulse line (maybe tagged), else None."""
    found = _ACTIVE.search(line)
    return float(found["cores"]) if found else None


def parse_waiting(line: str) -> str | None:
    """What the pulse line (maybe tagged) says the rank waits on, else None."""
    found = _ACTIVE.search(line)
    return found["io"] if found else None


def stopped_line(detail: str) -> str:
    """Rank 0's line after a requested stop: what was saved and where."""
    return f"{STOPPED_MARKER} {detail}"


def parse_stopped(line: str) -> str | None:
    """The detail of a stop line (maybe tagged), else None."""
    before, marker, detail = line.partition(STOPPED_MARKER)
    return detail.strip() if marker else None


def metrics_line(epoch: int, values: dict[str, float]) -> str:
    """The line SageMaker metric definitions read: `METRICS epoch=N key=value ...`."""
    pairs = " ".join(f"{key}={float(value):.6g}" for key, value in values.items())
    return f"{METRICS_PREFIX} epoch={epoch} {pairs}"


_METRICS = re.compile(re.escape(METRICS_PREFIX) + r" epoch=(?P<epoch>\d+)(?P<pairs>(?: \S+=\S+)*)")


def parse_metrics(line: str) -> dict[str, float] | None:
    """{"epoch": N, key: value, ...} of a METRICS line (maybe tagged), else None."""
    found = _METRICS.search(line)
    if not found:
        return None
    values = {"epoch": float(found["epoch"])}
    for pair in found["pairs"].split():
        key, _, value = pair.partition("=")
        try:
            values[key] = float(value)
        except ValueError:
            values[key] = math.nan
    return values


@dataclass(frozen=True)
class RankFailure:
    """What a failing rank reports about itself."""

    rank: int
    host: str
    kind: FailureKind
    error: str  # "ExceptionType: message", one line

    def line(self) -> str:
        return (
            f"{FAILURE_MARKER} rank={self.rank} host={self.host} kind={self.kind.value}: "
            f"{self.error}"
        )


# Python's own library and installed packages: a frame outside them is the user's code.
LIBRARY_PATHS = tuple(sysconfig.get_paths()[name] for name in ("stdlib", "purelib", "platlib"))


def failing_frame(error: BaseException) -> traceback.FrameSummary | None:
    """Where `error` was raised: the innermost frame of the traceback outside Python's own
    library and installed packages (the user's code that failed), else the innermost one."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if not frame.filename.startswith(LIBRARY_PATHS)]
    chosen = own or frames
    return chosen[-1] if chosen else None


def rank_failure(rank: int, host: str, error: BaseException) -> RankFailure:
    """The report of a rank dying of `error`; an error may declare its `kind` (ConfigError).
    An error of no declared kind is a bug in the rank's code: the report names the file and
    line it was raised at, since a bare `assert` says nothing else."""
    kind = getattr(error, "kind", None)
    if isinstance(kind, FailureKind):
        return RankFailure(rank, host, kind, error_text(error, None))
    return RankFailure(rank, host, FailureKind.RANK, error_text(error, failing_frame(error)))


def error_text(error: BaseException, frame: traceback.FrameSummary | None) -> str:
    """`Type: message (at file.py, line N: source) Hint: ...` in at most REPORT_LIMIT bytes,
    on one line.

    The type, the place and the hint are what a user acts on, so they stay whole and the
    message gets the bytes left; a long message (Keras prints whole tensors into its errors)
    keeps its head, which says what failed, and its tail, which often says why. The hint is
    looked up in the whole message, before any of it is cut.
    """
    name = type(error).__name__
    message = " ".join(str(error).split())
    hint = hint_for(f"{name}: {message}")
    tail = (_location(frame) if frame else "") + (f" Hint: {hint}" if hint else "")
    if not message:
        return name + tail
    room = REPORT_LIMIT - len(f"{name}: {tail}".encode(errors="replace"))
    return f"{name}: {elide(message, room)}{tail}"


def _location(frame: traceback.FrameSummary) -> str:
    source = " ".join((frame.line or "").split())
    quoted = f": {elide(source, SOURCE_LIMIT)}" if source else ""
    return f" (at {Path(frame.filename).name}, line {frame.lineno}{quoted})"


def elide(text: str, limit: int) -> str:
    """`text` in at most `limit` bytes of UTF-8: whole when it fits, else its head and its
    tail around ELISION, cut between characters.

    Bytes, since SageMaker's limit is in bytes and non-ASCII messages are common; both ends,
    since the start of a reason names what failed and its end where and why. A character
    UTF-8 cannot hold (a lone surrogate from a file name) becomes "?".
    """
    encoded = text.encode(errors="replace")
    if len(encoded) <= limit:
        return encoded.decode()
    room = limit - len(ELISION)
    if room <= 0:
        return encoded[: max(limit, 0)].decode(errors="ignore")
    head = encoded[: room - room // 2].decode(errors="ignore")
    tail = encoded[len(encoded) - room // 2 :].decode(errors="ignore")
    return f"{head}{ELISION}{tail}"


_FAILURE = re.compile(
    re.escape(FAILURE_MARKER) + r" rank=(?P<rank>\d{1,18}) host=(?P<host>\S+) "
    r"kind=(?P<kind>\w+): (?P<error>.*)$"
)


def parse_rank_failure(line: str) -> RankFailure | None:
    found = _FAILURE.search(line)
    if not found:
        return None
    try:
        kind = FailureKind(found["kind"])
    except ValueError:
        kind = FailureKind.RANK
    return RankFailure(int(found["rank"]), found["host"], kind, found["error"])
