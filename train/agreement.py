"""What every rank agrees on after an optimizer step: whether any rank was asked to stop, and
whether the leader's clock says a checkpoint is due. One MPI allreduce of a few bits, on every
stack (Horovod, MultiWorkerMirroredStrategy, Keras 3 on JAX), so every rank saves and stops
after the same step and none waits for a peer in a collective that the peer left.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from train.rank import StopRequest

STOP = 1  # a rank got the job's stop (SIGTERM forwarded as SIGUSR1: train.rank.StopRequest)
SAVE = 2  # a checkpoint is due by the leader's clock (Cadence)

SPIN_SECONDS = 0.002  # an agreement of ranks in step takes microseconds; then stop spinning
LONGEST_PAUSE = 0.01


def agree(bits: int) -> int:
    """The bitwise OR of `bits` over every rank: an MPI allreduce.

    A blocking MPI wait polls at full speed (OpenMPI yields between polls but stays runnable),
    so a rank waiting here for a slow or frozen peer would take the CPU from a peer sharing its
    core and look busy to its pulse (train.activity) for as long as the peer is frozen. So once
    the agreement has taken longer than SPIN_SECONDS, the wait polls with growing pauses.
    """
    sent, agreed = np.array([bits], dtype=np.int32), np.zeros(1, dtype=np.int32)
    request = MPI.COMM_WORLD.Iallreduce(sent, agreed, op=MPI.BOR)
    spin_until, pause = time.perf_counter() + SPIN_SECONDS, 1e-4
    while not request.Test():
        if time.perf_counter() >= spin_until:
            time.sleep(pause)
            pause = min(2 * pause, LONGEST_PAUSE)
    return int(agreed[0])


class Cadence:
    """A checkpoint every `minutes` of training (0: never by the clock), so a failure or a
    restart loses at most that much work even when epochs are long. Only the leader's clock
    counts: ranks' clocks differ, and a save every rank joins must start after the same step."""

    def __init__(self, minutes: float, leader: bool):
        self.seconds = minutes * 60
        self.leader = leader
        self.last = time.monotonic()

    def due(self) -> bool:
        return bool(self.seconds) and self.leader and time.monotonic() - self.last >= self.seconds

    def saved(self) -> None:
        self.last = time.monotonic()


def agree_after_step(cadence: Cadence | None) -> int:
    """What every rank agrees on after an optimizer step: STOP when any rank was asked to stop,
    SAVE when the leader's `cadence` says a checkpoint is due."""
    return agree(
        (STOP if StopRequest.requested() else 0)
        | (SAVE if cadence is not None and cadence.due() else 0)
    )
