"""A rank's signs of life, for the launcher's watchdog (container/watchdog.py).

A rank prints `TRAIN-PROGRESS step=N` when it finishes an optimizer step, at most once a second
(the launcher swallows these lines, so the log stays readable). train.rank.run_rank makes every
rank dump its Python stack on SIGUSR2, which the watchdog sends through mpirun when no rank
has made progress for too long: the stack of the stuck rank is what a user needs to fix it.
"""

from __future__ import annotations

import time

from job.protocol import progress_line
from train.rank import emit

INTERVAL = 1.0  # seconds between two lines of one rank; far below any sensible timeout


class Progress:
    """This rank's reporter; one per process."""

    last = -INTERVAL

    @classmethod
    def report(cls, step: int | None = None, *, force: bool = False) -> None:
        """`force`: print even within the interval (at the end of an epoch, so that the last
        step reported is the last step finished before validation and checkpointing)."""
        now = time.monotonic()
        if force or now - cls.last >= INTERVAL:
            cls.last = now
            emit(progress_line(step))
