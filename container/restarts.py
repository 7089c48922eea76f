"""Restarts inside the job: after a failure that another try may not repeat, the leader runs
every rank on every host again (`max_restarts` times at most), and each run resumes from the
newest checkpoint, so a restart costs the steps since that save, not a new cluster.

Only the leader decides: it alone runs mpirun, and the workers' launchers serve its ssh
sessions until it reports the job's outcome (container.coordination), so every host takes part
in every attempt and ends with the final one's exit code.

What is restarted: a rank that failed (its exception, or a signal such as the out-of-memory
killer's SIGKILL) and a hung job (the watchdog's exit 4). What is not: the user's
configuration or data (exit 2: the same input fails the same way), a stop (143: SageMaker
or the user asked the job to end), a lost host (exit 3: the cluster is no longer whole), an
internal error. And a failure that repeats itself: the same reason twice with no newer
checkpoint between (a bug at the same place, not bad luck) stops the retries early.
Each attempt's cause is printed and kept in `output/data/attempts.json` on the leader.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from container.failure import Outcome
from container.logs import log
from job.protocol import FailureKind

ATTEMPTS_FILE = "attempts.json"
RESTARTABLE = frozenset({FailureKind.RANK, FailureKind.HUNG})
NOT_RESTARTED_CODES = frozenset({2})  # a rank's own configuration or data error


@dataclass(frozen=True)
class Attempt:
    """One run of every rank that failed: its exit code, its reason, and the newest checkpoint
    when it ended ("" when there was none)."""

    exit_code: int
    reason: str
    checkpoint: str

    def same_as(self, other: Attempt) -> bool:
        """The same failure at the same place: which rank reported it first is chance (every
        rank may raise the same bug), so ranks and hosts are left out of the comparison."""
        return (self.exit_code, _unplaced(self.reason), self.checkpoint) == (
            other.exit_code,
            _unplaced(other.reason),
            other.checkpoint,
        )


def _unplaced(reason: str) -> str:
    return re.sub(r"\b(rank|worker) \d+ on host \S+", r"\1", reason)


def why_not_restart(outcome: Outcome, failed: list[Attempt], max_restarts: int) -> str | None:
    """None when the job should run its ranks again after `outcome` (the newest of the
    `failed` attempts), else why not, for the log."""
    if outcome.kind not in RESTARTABLE or outcome.exit_code in NOT_RESTARTED_CODES:
        return "not restarted: another try would fail the same way or was not wanted"
    if len(failed) > max_restarts:
        return f"{max_restarts} restart(s) allowed (max_restarts), all used"
    if len(failed) >= 2 and failed[-1].same_as(failed[-2]):
        return (
            "it failed twice the same way with no newer checkpoint between: a bug at "
            "the same place, not bad luck; not restarted again"
        )
    return None


def newest_checkpoint(directory: Path) -> str:
    """The name of the newest entry of the checkpoint folder, by modification time: all a
    restart needs is whether anything was saved since the last failure, and a user's script
    names its checkpoints as it likes (Keras's ModelCheckpoint, Orbax, its own files), so the
    product's `epoch-N` order (job.checkpoint_folders.newest_usable) cannot be assumed here."""
    try:
        entries = [entry for entry in directory.iterdir() if not entry.name.startswith(".")]
    except OSError:
        return ""
    return max(entries, key=lambda entry: entry.stat().st_mtime_ns).name if entries else ""


def write_attempts(output_dir: Path, failed: list[Attempt]) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    temporary = output_dir / f".tmp-{ATTEMPTS_FILE}"
    temporary.write_text(json.dumps([asdict(attempt) for attempt in failed], indent=2))
    os.replace(temporary, output_dir / ATTEMPTS_FILE)


def run_with_restarts(
    run: Callable[[], Outcome], max_restarts: int, checkpoint_dir: Path, output_dir: Path
) -> Outcome:
    """`run()` (every rank once, to its outcome) until it succeeds or may not run again; the
    last outcome, its reason naming the earlier attempts when there were any."""
    failed: list[Attempt] = []
    while True:
        outcome = run()
        if outcome.exit_code == 0 or not max_restarts:
            break
        failed.append(Attempt(outcome.exit_code, outcome.reason, newest_checkpoint(checkpoint_dir)))
        write_attempts(output_dir, failed)
        why = why_not_restart(outcome, failed, max_restarts)
        if why is not None:
            log.info(f"attempt {len(failed)} failed (exit code {outcome.exit_code}); {why}")
            break
        log.info(
            f"attempt {len(failed)} failed (exit code {outcome.exit_code}): "
            f"{outcome.reason}; restarting every rank on every host from "
            f"{failed[-1].checkpoint or 'the start (no checkpoint yet)'} "
            f"(restart {len(failed)} of {max_restarts})"
        )
    if len(failed) > 1 and outcome.exit_code:
        return Outcome(
            outcome.kind,
            f"{outcome.reason} (attempt {len(failed)}; every attempt "
            f"in output/data/{ATTEMPTS_FILE})",
            outcome.exit_code,
        )
    if failed:
        log.info(f"the job succeeded after {len(failed)} restart(s)")
    return outcome
