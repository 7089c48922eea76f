"""A ceiling on the request bodies a worker decodes at once, in bytes.

Decoding costs far more memory than the body: a 6 MB CSV body becomes a string, a list of
lists of strings and a float64 array, about 17 times its size at the peak. Without a bound,
64 concurrent 6 MB posts would need several gigabytes in one worker and get it killed. So a
request reserves its body's size before decoding it, and waits, up to its deadline, while
others hold the budget. Small bodies barely touch it, so one-row requests never queue behind
a large one; a body larger than the whole budget is decoded alone.

The budget is taken after the body is read, not before: a client that sends its body slowly
then holds a request thread, never the budget, so a few slow clients cannot stall everyone's
decoding. Raw bodies are bounded apart from it, by the request threads times the payload limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class DecodeBudget:
    """Bytes of request bodies being read and decoded at once, at most `capacity`."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.peak_bytes = 0  # the most ever held at once, for GET /metrics
        self._held = 0
        self._freed = threading.Condition()

    @contextmanager
    def hold(self, size: int, deadline: float) -> Iterator[None]:
        """Reserve `size` bytes for the block; raise TimeoutError at `deadline` (monotonic)."""
        with self._freed:
            room = self._has_room(size)
            if room:
                self._take(size)
        if not room:
            with self._freed:
                if not self._freed.wait_for(
                    lambda: self._has_room(size), timeout=max(0.0, deadline - time.monotonic())
                ):
                    raise TimeoutError("no room to decode the body before the deadline")
                self._take(size)
        try:
            yield
        finally:
            with self._freed:
                self._held -= size
                self._freed.notify_all()

    def _has_room(self, size: int) -> bool:
        return self._held == 0 or self._held + size <= self.capacity

    def _take(self, size: int) -> None:
        self._held += size
        self.peak_bytes = max(self.peak_bytes, self._held)
