"""Dynamic micro-batching: concurrent requests in one worker share one model call.

A model call has a fixed cost (dispatch into TensorFlow, thread-pool wake-ups) that dwarfs the
per-row cost of a small model, so answering 32 concurrent one-row requests with one call of 32
rows is many times cheaper than 32 calls.

There is no batching thread. The request thread that finds the model idle runs it at once, on
its own rows: a lone request pays no hand-off to another thread and no wait for company. While
that call runs, later requests queue; when it returns, its thread hands the model to the
oldest waiting request, whose thread runs one call for it and every request queued behind it
(up to `max_batch_size` instances), then hands on again. So batching engages by itself as
concurrency rises, batches are as large as what arrived during one call, and nothing ever
waits on a timer. A request larger than `max_batch_size` runs alone, in chunks of
`max_batch_size`. If a shared call fails, each request in it is retried alone, so one request
that breaks the model cannot fail the others.

Waiting is bounded in time and in number: a request gives up at its deadline (TimeoutError)
and leaves the queue, so it is never computed after its client was told it failed; a request
that finds `max_queue` requests waiting is refused at once (Overloaded). A call that never
returns keeps the model busy forever: `stalled_s` says for how long, for /ping to report it.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Predict = Callable[[npt.NDArray[Any]], npt.NDArray[Any]]


class Overloaded(Exception):
    """More requests are waiting for the model than the queue holds."""


@dataclass
class BatchStats:
    """Counters of this worker's batching, served on GET /metrics; written under one lock."""

    batches: int = 0
    requests: int = 0
    instances: int = 0
    largest_batch_instances: int = 0
    largest_batch_requests: int = 0
    timed_out: int = 0  # gave up at their deadline, never computed after it
    refused: int = 0  # found the queue full


class _State(enum.Enum):
    QUEUED = "queued"  # waiting for the model
    LEADING = "leading"  # its thread runs the next call
    TAKEN = "taken"  # part of a call in progress
    DONE = "done"  # outputs or error set
    EXPIRED = "expired"  # dropped from the queue at its deadline


@dataclass(eq=False)  # found in the queue by identity: its arrays have no single truth value
class _Request:
    batch: npt.NDArray[Any]
    deadline: float  # time.monotonic()
    state: _State = _State.QUEUED
    outputs: npt.NDArray[Any] | None = None
    error: Exception | None = None
    wake: threading.Event = field(default_factory=threading.Event)


class MicroBatcher:
    """Coalesces concurrent `submit` calls into model calls of at most `max_batch_size` rows."""

    def __init__(self, predict: Predict, max_batch_size: int, max_queue: int):
        self._predict = predict
        self._max_batch_size = max_batch_size
        self._max_queue = max_queue
        self._lock = threading.Lock()
        self._queue: deque[_Request] = deque()
        self._busy_since: float | None = None  # monotonic start of the call in progress
        self.stats = BatchStats()

    def stalled_s(self) -> float:
        """How long the call in progress has been running; 0 when the model is idle."""
        busy_since = self._busy_since
        return 0.0 if busy_since is None else time.monotonic() - busy_since

    def waiting(self) -> int:
        """Requests queued for the model now."""
        return len(self._queue)

    def submit(self, batch: npt.NDArray[Any], deadline: float) -> npt.NDArray[Any]:
        """The model's outputs for `batch`, computed alone or with others; raise TimeoutError
        at `deadline` (time.monotonic()) and Overloaded when the queue is full."""
        request = _Request(batch, deadline)
        with self._lock:
            now = time.monotonic()
            if deadline <= now:  # spent decoding or sending: never computed after it
                self.stats.timed_out += 1
                raise TimeoutError("no prediction before the deadline")
            if self._busy_since is None:
                self._busy_since = now
                request.state = _State.LEADING
            elif len(self._queue) >= self._max_queue:
                self.stats.refused += 1
                raise Overloaded(f"{len(self._queue)} requests are already waiting")
            else:
                self._queue.append(request)
        if request.state is not _State.LEADING:
            self._wait(request)
        if request.state is _State.LEADING:
            self._lead(request)
        if request.error is not None:
            raise request.error
        if request.outputs is None:  # _settle gives each request its outputs or its error
            raise RuntimeError("the micro-batcher settled a request with neither outputs nor error")
        return request.outputs

    def _wait(self, request: _Request) -> None:
        """Until the request is answered or must lead; TimeoutError at its deadline."""
        woken = request.wake.wait(max(0.0, request.deadline - time.monotonic()))
        if woken:
            return
        with self._lock:
            if request.state is _State.QUEUED:
                self._queue.remove(request)
            elif request.state is _State.LEADING:  # handed the model just now: hand it on
                self._hand_on()
            elif request.state is _State.DONE:
                return
            request.state = _State.EXPIRED
            self.stats.timed_out += 1
        raise TimeoutError("no prediction before the deadline")

    def _lead(self, first: _Request) -> None:
        """Run one call for `first` and the requests queued behind it, then hand on."""
        try:
            with self._lock:
                call, size = [first], len(first.batch)
                now = time.monotonic()
                while self._queue and size + len(self._queue[0].batch) <= self._max_batch_size:
                    request = self._queue.popleft()
                    if request.deadline <= now:
                        self._expire(request)
                        continue
                    request.state = _State.TAKEN
                    call.append(request)
                    size += len(request.batch)
                first.state = _State.TAKEN
            self._answer(call)
        finally:
            with self._lock:
                self._hand_on()

    def _expire(self, request: _Request) -> None:
        request.state = _State.EXPIRED
        request.error = TimeoutError("no prediction before the deadline")
        self.stats.timed_out += 1
        request.wake.set()

    def _hand_on(self) -> None:
        """Give the model to the oldest waiting request in time, else mark it idle (locked)."""
        now = time.monotonic()
        while self._queue:
            request = self._queue.popleft()
            if request.deadline <= now:
                self._expire(request)
                continue
            request.state = _State.LEADING
            self._busy_since = now
            request.wake.set()
            return
        self._busy_since = None

    def _answer(self, call: list[_Request]) -> None:
        try:
            batch = call[0].batch if len(call) == 1 else np.concatenate([r.batch for r in call])
            outputs = self._predict_chunked(batch)
        except Exception as error:  # reported by each request's own thread
            if len(call) > 1:
                for request in call:  # isolate the request that breaks the model
                    self._answer([request])
            else:
                self._settle(call[0], error=error)
            return
        self._count(call, len(batch))
        start = 0
        for request in call:
            end = start + len(request.batch)
            self._settle(request, outputs=outputs[start:end])
            start = end

    def _settle(
        self,
        request: _Request,
        outputs: npt.NDArray[Any] | None = None,
        error: Exception | None = None,
    ) -> None:
        with self._lock:
            if request.state is _State.EXPIRED:  # its thread has answered 503 already
                return
            request.outputs, request.error, request.state = outputs, error, _State.DONE
        request.wake.set()

    def _predict_chunked(self, batch: npt.NDArray[Any]) -> npt.NDArray[Any]:
        if len(batch) <= self._max_batch_size:
            return self._predict(batch)
        return np.concatenate(
            [
                self._predict(batch[start : start + self._max_batch_size])
                for start in range(0, len(batch), self._max_batch_size)
            ]
        )

    def _count(self, call: list[_Request], instances: int) -> None:
        with self._lock:
            stats = self.stats
            stats.batches += 1
            stats.requests += len(call)
            stats.instances += instances
            stats.largest_batch_instances = max(stats.largest_batch_instances, instances)
            stats.largest_batch_requests = max(stats.largest_batch_requests, len(call))
