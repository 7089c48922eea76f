"""The micro-batcher with a numpy "model": coalescing, limits, deadlines and failure isolation.

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

from serve.batching import MicroBatcher, Overloaded
from tests.waiting import eventually

POISON = -1.0  # the fake model fails on any batch holding this value


class HeldModel:
    """Doubles its input; holds its first call until `release()`; records every call's rows
    and the thread that made it."""

    def __init__(self):
        self.calls: list[list[float]] = []
        self.threads: list[int] = []
        self._first_call = threading.Event()
        self._released = threading.Event()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.calls.append(batch[:, 0].tolist())
        self.threads.append(threading.get_ident())
        self._first_call.set()
        self._released.wait(timeout=30)
        if (batch == POISON).any():
            raise ValueError("poisoned batch")
        return batch * 2

    def wait_for_first_call(self):
        assert self._first_call.wait(timeout=30), "the batcher never called the model"

    def release(self):
        self._released.set()


def in_s(seconds: float) -> float:
    """The deadline `seconds` from now."""
    return time.monotonic() + seconds


def rows(*values: float) -> np.ndarray:
    return np.array([[value] for value in values], np.float32)


def wait_until_queued(batcher: MicroBatcher, count: int) -> None:
    """Until `count` requests wait in the batcher's queue (0: the batcher took them all)."""
    eventually(
        lambda: len(batcher._queue) == count,
        f"the queue never held {count} requests",
        30,
        every=0.001,
    )


def run_held(
    batcher: MicroBatcher, model: HeldModel, first: np.ndarray, then: list[np.ndarray]
) -> list:
    """Submit `first`, then queue `then` while the model holds `first`'s call; return the
    answers (arrays, or exceptions) in submission order."""

    def submit(batch):
        try:
            return batcher.submit(batch, in_s(30))
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
    batcher = MicroBatcher(model, max_batch_size=16, max_queue=16)
    answers = run_held(batcher, model, rows(1), [rows(2, 3), rows(4), rows(5, 6, 7)])
    assert model.calls == [[1], [2, 3, 4, 5, 6, 7]]
    for answer, expected in zip(answers, [[2], [4, 6], [8], [10, 12, 14]]):
        assert answer[:, 0].tolist() == expected
    stats = batcher.stats
    assert (stats.batches, stats.requests, stats.instances) == (2, 4, 7)
    assert (stats.largest_batch_requests, stats.largest_batch_instances) == (3, 6)


def test_a_call_never_exceeds_the_maximum_batch_size():
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=4, max_queue=16)
    answers = run_held(batcher, model, rows(1), [rows(2, 3, 4), rows(5, 6), rows(7)])
    assert model.calls == [[1], [2, 3, 4], [5, 6, 7]]
    assert [a[:, 0].tolist() for a in answers] == [[2], [4, 6, 8], [10, 12], [14]]


def test_a_request_larger_than_the_maximum_is_predicted_in_chunks():
    model = HeldModel()
    model.release()
    batcher = MicroBatcher(model, max_batch_size=4, max_queue=16)
    answer = batcher.submit(rows(*range(10)), in_s(30))
    assert model.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert answer[:, 0].tolist() == [2 * value for value in range(10)]


def test_a_request_that_breaks_the_model_fails_alone():
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=16, max_queue=16)
    answers = run_held(batcher, model, rows(1), [rows(2), rows(POISON), rows(3)])
    assert model.calls == [[1], [2, POISON, 3], [2], [POISON], [3]]
    assert answers[0][:, 0].tolist() == [2]
    assert answers[1][:, 0].tolist() == [4]
    assert isinstance(answers[2], ValueError)
    assert answers[3][:, 0].tolist() == [6]


def test_a_lone_request_runs_at_once_in_its_own_thread():
    model = HeldModel()
    model.release()
    batcher = MicroBatcher(model, max_batch_size=16, max_queue=16)
    assert batcher.submit(rows(1), in_s(30))[:, 0].tolist() == [2]
    assert model.threads == [threading.get_ident()]  # no hand-off to another thread
    assert batcher.stalled_s() == 0


def test_a_request_waiting_past_its_deadline_times_out_and_is_never_computed():
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=16, max_queue=16)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(batcher.submit, rows(1), in_s(30))
        model.wait_for_first_call()
        with pytest.raises(TimeoutError):
            batcher.submit(rows(2), in_s(0.05))
        assert len(batcher._queue) == 0  # it left the queue
        assert batcher.stalled_s() > 0.05
        model.release()
        assert first.result()[:, 0].tolist() == [2]
    assert batcher.submit(rows(3), in_s(30))[:, 0].tolist() == [6]
    assert model.calls == [[1], [3]]
    assert batcher.stats.timed_out == 1


def test_a_request_expiring_behind_others_leaves_the_queue_alone():
    """Leaving the queue finds the request by identity: two requests of several rows each
    must not be compared by value (numpy refuses to give one truth value for an array)."""
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=16, max_queue=16)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(batcher.submit, rows(1), in_s(30))
        model.wait_for_first_call()
        ahead = pool.submit(batcher.submit, rows(2, 3), in_s(30))
        wait_until_queued(batcher, 1)
        with pytest.raises(TimeoutError):
            batcher.submit(rows(4, 5), in_s(0.05))
        assert len(batcher._queue) == 1  # only the expired request left it
        model.release()
        assert first.result()[:, 0].tolist() == [2]
        assert ahead.result()[:, 0].tolist() == [4, 6]
    assert model.calls == [[1], [2, 3]]


def test_a_request_past_its_deadline_is_not_computed_on_an_idle_model():
    model = HeldModel()
    model.release()
    batcher = MicroBatcher(model, max_batch_size=16, max_queue=16)
    with pytest.raises(TimeoutError):
        batcher.submit(rows(1), in_s(-1))
    assert model.calls == [] and batcher.stalled_s() == 0
    assert batcher.stats.timed_out == 1
    assert batcher.submit(rows(2), in_s(30))[:, 0].tolist() == [4]


def test_a_full_queue_refuses_at_once():
    model = HeldModel()
    batcher = MicroBatcher(model, max_batch_size=16, max_queue=2)
    answers = []
    with ThreadPoolExecutor(3) as pool:
        pool.submit(batcher.submit, rows(1), in_s(30))
        model.wait_for_first_call()
        for value in (2, 3):
            answers.append(pool.submit(batcher.submit, rows(value), in_s(30)))
        wait_until_queued(batcher, 2)
        with pytest.raises(Overloaded):
            batcher.submit(rows(4), in_s(30))
        model.release()
        assert [a.result()[:, 0].tolist() for a in answers] == [[4], [6]]
    assert model.calls == [[1], [2, 3]]
    assert batcher.stats.refused == 1
