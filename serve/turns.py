"""A worker's requests take turns at their Python work, in the order they ask for it.

All of a worker's request threads share one interpreter lock, and CPython hands it on in no
particular order: a thread that has just sent an answer and read its connection's next request
often takes it before threads that have waited far longer. Under load a request's latency then
depends on how often it loses that race: the slowest 1 % took 2.5 times the median (MLP at
concurrency 64), and 32 threads fighting for the lock cost throughput too. Here each request
runs in its turn (serve.keepalive takes it around gunicorn's handling of the request), turns
go strictly in arrival order, one at a time, as on the one thread of an event loop, and a
request gives its turn to the next whenever it would wait: for the model's other calls, for
its own model call (TensorFlow releases the interpreter lock, so the next requests' Python
overlaps it), for a client that sends or reads slowly, for room in the decode budget, or
while it decodes and encodes a large body (those share the lock the usual way rather than
hold back every small request behind them).

Measured on 2 cores against the same server without turns, `wrk` with keep-alive connections,
the MLP at concurrency 64: 2419 -> 3136 requests/s, p99 61 -> 39 ms (the careful baseline's
58); at 32: p99 29 -> 22 ms; the CNN at 64: p99 300 -> 123 ms.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Iterator


class Turns:
    """One turn at a time, first come first served; `paused` gives the turn away meanwhile."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken = False
        self._waiting: deque[threading.Event] = deque()
        self._mine = threading.local()

    @contextmanager
    def turn(self) -> Iterator[None]:
        self._take()
        try:
            yield
        finally:
            self._give()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Let the next request go while this one waits; nothing outside a turn."""
        if not getattr(self._mine, "holding", False):
            yield
            return
        self._give()
        try:
            yield
        finally:
            self._take()

    def _take(self) -> None:
        with self._lock:
            if self._taken:
                ready = threading.Event()
                self._waiting.append(ready)
            else:
                self._taken, ready = True, None
        if ready is not None:
            ready.wait()  # the turn is handed over with it taken
        self._mine.holding = True

    def _give(self) -> None:
        self._mine.holding = False
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()
            else:
                self._taken = False


TURNS = Turns()  # the worker's: its request threads (serve.keepalive) and the app share it
