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

METRICS_PREFIX = "METRICS"
FAILURE_MARKER = "TRAIN-FAILURE"
STOPPED_MARKER = "TRAIN-STOPPED"
TIME_MARKER = "TRAIN-MARK"
PROGRESS_MARKER = "TRAIN-PROGRESS"
REPORT_LIMIT = 600  # characters of the error in a failure report


class FailureKind(Enum):
    """Why a job failed; `exit_code` maps each kind to the code the job exits with."""

    CONFIG = "config"      # configuration or data: the user's to fix
    CLUSTER = "cluster"    # a host, sshd, the network or the leader/worker protocol
    RANK = "rank"          # a rank program failed: its own exit code
    STOPPED = "stopped"    # a stop signal (job stopped, max runtime, spot reclaim)
    HUNG = "hung"          # no rank made progress for progress_timeout seconds
    INTERNAL = "internal"  # a bug in the launcher


def exit_code(kind: FailureKind, rank_code: int = 1) -> int:
    """The exit code of a job that failed for `kind`; `rank_code` is the failed rank's own."""
    codes = {FailureKind.CONFIG: 2, FailureKind.CLUSTER: 3, FailureKind.HUNG: 4,
             FailureKind.STOPPED: 143, FailureKind.INTERNAL: 1}
    return codes.get(kind, rank_code or 1)


class Mark(Enum):
    """Moments of a run that benchmarks time, printed as `TRAIN-MARK <name>`."""

    HOSTS_READY = "hosts_ready"        # launcher: every host is ready, mpirun starts
    RANKS_UP = "ranks_up"              # rank 0: Horovod is up on every rank
    DATA_READ = "data_read"            # rank 0: the training data is loaded
    MODEL_EXPORTED = "model_exported"  # rank 0: the model is written
    JOB_DONE = "job_done"              # launcher: mpirun ended, the job completed


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


_PROGRESS = re.compile(re.escape(PROGRESS_MARKER) + r"(?: step=(?P<step>\d+))?\s*$")


def parse_progress(line: str) -> tuple[bool, int | None]:
    """(is it a progress line, the step it names) of a line, maybe tagged."""
    found = _PROGRESS.search(line)
    return (True, int(found["step"]) if found["step"] else None) if found else (False, None)


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
        return (f"{FAILURE_MARKER} rank={self.rank} host={self.host} kind={self.kind.value}: "
                f"{self.error}")


# Python's own library and installed packages: a frame outside them is the user's code.
LIBRARY_PATHS = tuple(sysconfig.get_paths()[name] for name in ("stdlib", "purelib", "platlib"))


def failing_frame(error: BaseException) -> traceback.FrameSummary | None:
    """Where `error` was raised: the innermost frame of the traceback outside Python's own
    library and installed packages (the user's code that failed), else the innermost one."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if not frame.filename.startswith(LIBRARY_PATHS)]
    return (own or frames or [None])[-1]


def rank_failure(rank: int, host: str, error: BaseException) -> RankFailure:
    """The report of a rank dying of `error`; an error may declare its `kind` (ConfigError).
    An error of no declared kind is a bug in the rank's code: the report names the file and
    line it was raised at, since a bare `assert` says nothing else."""
    kind = getattr(error, "kind", None)
    text = f"{type(error).__name__}: {error}".strip().removesuffix(":")
    frame = None if isinstance(kind, FailureKind) else failing_frame(error)
    if frame is not None:
        source = f": {frame.line}" if frame.line else ""
        text += f" (at {Path(frame.filename).name}, line {frame.lineno}{source})"
    return RankFailure(rank, host, kind if isinstance(kind, FailureKind) else FailureKind.RANK,
                       text.replace("\n", " ")[:REPORT_LIMIT])


_FAILURE = re.compile(re.escape(FAILURE_MARKER) + r" rank=(?P<rank>\d+) host=(?P<host>\S+) "
                      r"kind=(?P<kind>\w+): (?P<error>.*)$")


def parse_rank_failure(line: str) -> RankFailure | None:
    found = _FAILURE.search(line)
    if not found:
        return None
    try:
        kind = FailureKind(found["kind"])
    except ValueError:
        kind = FailureKind.RANK
    return RankFailure(int(found["rank"]), found["host"], kind, found["error"])
