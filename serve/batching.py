"""Dynamic micro-batching: concurrent requests in one worker share one model call.

A model call has a fixed cost (dispatch into TensorFlow, thread-pool wake-ups) that dwarfs the
per-row cost of a small model, so answering 32 concurrent one-row requests with one call of 32
rows is many times cheaper than 32 calls. Request threads `submit` their validated batch and
block; one batching thread takes the first waiting request, then gathers more until the call
holds `max_batch_size` instances or `max_wait_s` has passed since it took the first, runs the
model once and hands every request its own slice of the outputs. This is the scheme of TF
Serving's batcher (max_batch_size, batch_timeout_micros) and Triton's dynamic batcher.

While a call runs, new requests queue up, so under load batches fill without any waiting.
Waiting only pays when another request is about to arrive, so the batcher waits only while
some request is `arriving` (reading and checking its body, about to `submit`): a lone request
is run at once instead of idling `max_wait_s` for company that is not coming. A request
larger than `max_batch_size` is run alone, in chunks of `max_batch_size`, so the model never
sees more rows at once than configured. If a shared call fails, each request in it is retried
alone, so one request that breaks the model cannot fail the others.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

Predict = Callable[[np.ndarray], np.ndarray]


@dataclass
class BatchStats:
    """Counters of this worker's batching, served on GET /metrics; written by one thread."""

    batches: int = 0
    requests: int = 0
    instances: int = 0
    largest_batch_instances: int = 0
    largest_batch_requests: int = 0


@dataclass
class _Request:
    batch: np.ndarray
    answer: Future


class MicroBatcher:
    """Coalesces concurrent `submit` calls into model calls of at most `max_batch_size` rows."""

    def __init__(self, predict: Predict, max_batch_size: int, max_wait_s: float):
        self._predict = predict
        self._max_batch_size = max_batch_size
        self._max_wait_s = max_wait_s
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._held: _Request | None = None  # taken from the queue but did not fit the last call
        self._arriving = 0
        self._arriving_lock = threading.Lock()
        self.stats = BatchStats()
        # A daemon: the worker process ends when gunicorn has answered its last request.
        self._thread = threading.Thread(target=self._run, name="micro-batcher", daemon=True)

    def start(self) -> MicroBatcher:
        self._thread.start()
        return self

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Count a request as on its way to `submit` while it decodes (see the module doc).

        Leave the block before calling `submit`: a request counted while already queued
        would make every call wait out `max_wait_s` for it.
        """
        with self._arriving_lock:
            self._arriving += 1
        try:
            yield
        finally:
            with self._arriving_lock:
                self._arriving -= 1

    def submit(self, batch: np.ndarray, timeout_s: float) -> np.ndarray:
        """Predict `batch` as part of a shared call; raise TimeoutError after `timeout_s`."""
        answer: Future = Future()
        self._queue.put(_Request(batch, answer))
        return answer.result(timeout_s)

    def _run(self) -> None:
        while True:
            self._answer(self._gather())

    def _next(self, timeout_s: float | None) -> _Request:
        """The held-over request, else the next queued one; raise queue.Empty on timeout."""
        if self._held is not None:
            request, self._held = self._held, None
            return request
        return self._queue.get(timeout=timeout_s)

    def _gather(self) -> list[_Request]:
        """Block for one request, then add more until the call is full, nothing more is on
        its way, or the wait is over."""
        first = self._next(timeout_s=None)
        call, size = [first], len(first.batch)
        deadline = time.monotonic() + self._max_wait_s
        while size < self._max_batch_size and (self._arriving or not self._queue.empty()):
            try:
                request = self._next(timeout_s=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if size + len(request.batch) > self._max_batch_size:
                self._held = request
                break
            call.append(request)
            size += len(request.batch)
        return call

    def _answer(self, call: list[_Request]) -> None:
        try:
            batch = call[0].batch if len(call) == 1 else np.concatenate([r.batch for r in call])
            outputs = self._predict_chunked(batch)
        except Exception as error:  # the request thread reports it; this thread must live on
            if len(call) > 1:
                for request in call:  # isolate the request that breaks the model
                    self._answer([request])
            else:
                call[0].answer.set_exception(error)
            return
        self._count(call, len(batch))
        start = 0
        for request in call:
            end = start + len(request.batch)
            request.answer.set_result(outputs[start:end])
            start = end

    def _predict_chunked(self, batch: np.ndarray) -> np.ndarray:
        if len(batch) <= self._max_batch_size:
            return self._predict(batch)
        return np.concatenate([self._predict(batch[start:start + self._max_batch_size])
                               for start in range(0, len(batch), self._max_batch_size)])

    def _count(self, call: list[_Request], instances: int) -> None:
        stats = self.stats
        stats.batches += 1
        stats.requests += len(call)
        stats.instances += instances
        stats.largest_batch_instances = max(stats.largest_batch_instances, instances)
        stats.largest_batch_requests = max(stats.largest_batch_requests, len(call))
