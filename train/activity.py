"""A rank's pulse: whether it is computing, for the launcher's watchdog (container/watchdog.py).

Steps and printed lines show that a rank makes progress, but a healthy rank can go minutes
without either: a long epoch under `fit(verbose=2)` prints once, a script's own loop prints
when it likes, a leader evaluates or saves alone while the others wait. What such a rank does
and a hung one does not is want the CPU: a rank asleep, blocked in a read, deadlocked, waiting
for a peer in a collective or frozen wants none. So every rank program runs a pulse thread
(train.rank.run_rank starts it) that measures, every PULSE_SECONDS, how much of that time its
threads ran or were ready to run (the kernel's schedstat: time on a CPU plus time waiting for
one, so that a rank on a crowded host counts as working as much as one on an idle host) and,
when that is at least BUSY_CORES, writes `TRAIN-ACTIVE cpu=N` to stderr, in one `os.write` of
one whole line: never into the middle of a line the script is writing to stdout. The launcher
swallows these lines.

Waiting that burns CPU without working is kept out of the measure:
- Horovod's background thread negotiates with the other ranks every cycle, and spins in MPI
  (yielding, but runnable) while a peer does not answer: the threads that Horovod's `init`
  starts are not counted.
- The trainer's own per-step MPI agreement waits without spinning (train.agreement.agree).
A script's own busy-wait loop counts as computing. A frozen process's pulse is frozen with it,
and a rank whose C code holds the interpreter lock through a whole pulse is not heard from
meanwhile (TensorFlow, JAX and NumPy release it while they compute).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
import time
from pathlib import Path
from typing import Callable

from job.protocol import PULSE_SECONDS, active_line, progress_line

# Measured with 2 ranks on 2 cores: a rank that computes wants about a core or more (0.9-2.5,
# more when other jobs crowd the host); a rank asleep or waiting for a peer in a collective,
# its communication threads left out, under 0.01.
BUSY_CORES = 0.1


def thread_ids() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/task")}


def thread_demand(thread_id: int) -> float:
    """Seconds one thread of this process has run or waited to run; 0 when it has ended."""
    try:
        running, waiting, _ = Path(f"/proc/self/task/{thread_id}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0
    return (int(running) + int(waiting)) / 1e9


class Pulse:
    """This process's pulse; `excluded` holds the communication threads' ids."""

    excluded: set[int] = set()

    @classmethod
    def start(cls, interval: float = PULSE_SECONDS) -> None:
        threading.Thread(target=cls._beat, args=(interval,), name="train-pulse",
                         daemon=True).start()

    @classmethod
    def demand(cls) -> dict[int, float]:
        """Each thread's demand for the CPU so far, this pulse's own thread and the excluded
        ones left out."""
        left_out = cls.excluded | {threading.get_native_id()}
        return {thread: thread_demand(thread) for thread in thread_ids() - left_out}

    @classmethod
    def _beat(cls, interval: float) -> None:
        clock, before = time.monotonic(), cls.demand()
        while True:
            time.sleep(interval)
            now, after = time.monotonic(), cls.demand()
            # a thread started since the last pulse counts from its start; one ended is gone
            cores = sum(seconds - before.get(thread, 0.0) for thread, seconds in after.items()) \
                / max(now - clock, 1e-3)
            clock, before = now, after
            if cores >= BUSY_CORES and not say(active_line(cores)):
                return

    @classmethod
    def last(cls) -> None:
        """A heartbeat as the rank program returns: the interpreter's teardown follows (atexit
        handlers, MPI_Finalize, freeing the model), during which the pulse thread no longer
        runs; the watchdog's allowance starts again here."""
        say(progress_line(None))


def say(line: str) -> bool:
    """`line` to stderr in one write; False when stderr is gone (and so is anyone to tell)."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        return False
    return True


def excluding_new_threads(function: Callable) -> Callable:
    """`function`, with the threads it starts left out of the pulse."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        before = thread_ids()
        try:
            return function(*args, **kwargs)
        finally:
            Pulse.excluded |= thread_ids() - before

    call.excludes_new_threads = True
    return call


def exclude_horovod_threads() -> None:
    """Leave out the threads of Horovod's `init` (its background thread), where Horovod is
    installed. Done on the class before any rank program imports `horovod.tensorflow`, whose
    `init` is the method of an instance of it, looked up when that module is imported."""
    if importlib.util.find_spec("horovod") is None:
        return
    from horovod.common.basics import HorovodBasics

    if not getattr(HorovodBasics.init, "excludes_new_threads", False):
        HorovodBasics.init = excluding_new_threads(HorovodBasics.init)
