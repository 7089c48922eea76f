"""The micro-batcher with a numpy "model": coalescing, limits, waiting and failure isolation.

Each test makes the order of events certain instead of relying on timing: the fake model
holds its first call until the test has queued the next requests, so what the following call
must contain is known exactly.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from serve.batching import MicroBatcher

POISON = -1.0  # the fake model fails on any batch holding this value


class HeldModel:
    """Doubles its input; holds its first call until `release()`; records every call's rows."""

    def __init__(self):
        self.calls: list[list[float]] = []
        self._first_call = threading.Event()
        self._released = threading.Event()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.calls.append(batch[:, 0].tolist())
        self._first_call.set()
        self._released.wait(timeout=30)
        if (batch == POISON).any():
            raise ValueError("poisoned batch")
        return batch * 2

    def wait_for_first_call(self):
        assert self._first_call.wait(timeout=30), "the batcher never called the model"

    def release(self):
        self._released.set()


def rows(*values: float) -> np.ndarray:
    return np.array([[value] for value in values], np.float32)


def wait_until_queued(batcher: MicroBatcher, count: int) -> None:
    """Until `count` requests wait in the batcher's queue (0: the batcher took them all)."""
    deadline = time.monotonic() + 30
    while batcher._queue.qsize() != count:
        assert time.monotonic() < deadline, f"the queue never held {count} requests"
        time.sleep(0.001)


def run_held(batcher: MicroBatcher, model: HeldModel, first: np.ndarray,
             then: list[np.ndarray]) -> list:
    """Submit `first`, then queue `then` while the model holds `first`'s call; return the
    answers (arrays, or exceptions) in submission order."""
    def submit(batch):
        try:
            return batcher.submit(batch, timeout_s=30)
        except Exception as error:
            return error

    with ThreadPoolExecutor(len(then) + 1) as pool:
        futures = [pool.submit(submit, first)]
        model.wait_for_first_call()
        for batch in then:
            futures.append(pool.submit(submit, batch))
            wait_until_queued(batcher, len(futures) - 1)
        model.release()
        return [future.result() for future in futures]


def test_requests_queued_during_a_call_share_the_next_one():
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=16, max_wait_s=0.001).start()
    answers = run_held(batcher, model, rows(1), [rows(2, 3), rows(4), rows(5, 6, 7)])
    assert model.calls == [[1], [2, 3, 4, 5, 6, 7]]
    for answer, expected in zip(answers, [[2], [4, 6], [8], [10, 12, 14]]):
        assert answer[:, 0].tolist() == expected
    stats = batcher.stats
    assert (stats.batches, stats.requests, stats.instances) == (2, 4, 7)
    assert (stats.largest_batch_requests, stats.largest_batch_instances) == (3, 6)


def test_a_call_never_exceeds_the_maximum_batch_size():
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=4, max_wait_s=0.001).start()
    answers = run_held(batcher, model, rows(1), [rows(2, 3, 4), rows(5, 6), rows(7)])
    assert model.calls == [[1], [2, 3, 4], [5, 6, 7]]
    assert [a[:, 0].tolist() for a in answers] == [[2], [4, 6, 8], [10, 12], [14]]


def test_a_request_larger_than_the_maximum_is_predicted_in_chunks():
    model = HeldModel()
    model.release()
    batcher = MicroBatcher(model, max_batch_size=4, max_wait_s=0.001).start()
    answer = batcher.submit(rows(*range(10)), timeout_s=30)
    assert model.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert answer[:, 0].tolist() == [2 * value for value in range(10)]


def test_a_request_that_breaks_the_model_fails_alone():
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=16, max_wait_s=0.001).start()
    answers = run_held(batcher, model, rows(1), [rows(2), rows(POISON), rows(3)])
    assert model.calls == [[1], [2, POISON, 3], [2], [POISON], [3]]
    assert answers[0][:, 0].tolist() == [2]
    assert answers[1][:, 0].tolist() == [4]
    assert isinstance(answers[2], ValueError)
    assert answers[3][:, 0].tolist() == [6]


def test_a_lone_request_does_not_wait_for_company():
    model = HeldModel()
    model.release()
    batcher = MicroBatcher(model, max_batch_size=16, max_wait_s=600).start()
    assert batcher.submit(rows(1), timeout_s=30)[:, 0].tolist() == [2]  # not after 600 s


def test_the_call_waits_for_a_request_that_is_arriving():
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=16, max_wait_s=600).start()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(batcher.submit, rows(1), 30)
        model.wait_for_first_call()
        with batcher.arriving():  # the third request is being decoded
            second = pool.submit(batcher.submit, rows(2), 30)
            wait_until_queued(batcher, 1)
            model.release()
            wait_until_queued(batcher, 0)  # the batcher took the second and waits for the third
        third = batcher.submit(rows(3), timeout_s=30)
        assert [first.result()[:, 0].tolist(), second.result()[:, 0].tolist()] == [[2], [4]]
    assert third[:, 0].tolist() == [6]
    assert model.calls == [[1], [2, 3]]


def test_a_prediction_that_takes_too_long_raises_timeout():
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=16, max_wait_s=0.001).start()
    with pytest.raises(TimeoutError):
        batcher.submit(rows(1), timeout_s=0.05)
    model.release()
    assert batcher.submit(rows(2), timeout_s=30)[:, 0].tolist() == [4]
