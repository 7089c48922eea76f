"""serve.turns: requests take their turns in the order they asked, one at a time, and a request
that pauses (waiting for the model or for its client) lets the next one go meanwhile."""

from __future__ import annotations

import threading
import time

import numpy as np

from serve.batching import MicroBatcher
from serve.limits import DecodeBudget
from serve.turns import Turns


def wait_until(condition, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def queued(turns: Turns) -> int:
    return len(turns._waiting)


def test_turns_go_in_the_order_they_were_asked_for():
    turns, order = Turns(), []

    def request(index: int) -> None:
        with turns.turn():
            order.append(index)

    threads = []
    with turns.turn():
        for index in range(8):  # each asks only once the one before it is waiting
            threads.append(threading.Thread(target=request, args=(index,)))
            threads[-1].start()
            wait_until(lambda: queued(turns) == index + 1)
    for thread in threads:
        thread.join(10)
    assert order == list(range(8))


def test_a_paused_request_lets_the_next_go_and_then_waits_its_turn_again():
    turns, events = Turns(), []
    resume = threading.Event()

    def first() -> None:
        with turns.turn():
            events.append("first starts")
            with turns.paused():
                resume.wait(10)  # waiting for the model: the others go meanwhile
            events.append("first resumes")

    def second() -> None:
        with turns.turn():
            events.append("second runs")
            resume.set()
            time.sleep(0.05)  # still its turn: the first must not resume yet
            events.append("second ends")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    wait_until(lambda: events == ["first starts"])
    threads[1].start()
    for thread in threads:
        thread.join(10)
    assert events == ["first starts", "second runs", "second ends", "first resumes"]


def test_pausing_outside_a_turn_gives_away_nobody_elses():
    turns, taken = Turns(), threading.Event()
    with turns.turn():
        with turns.paused():  # this thread's own turn: given away, then taken back
            pass

        def outsider() -> None:
            with turns.paused():  # holds no turn: must not free the main thread's
                pass
            with turns.turn():
                taken.set()

        thread = threading.Thread(target=outsider)
        thread.start()
        assert not taken.wait(0.2)
    thread.join(10)
    assert taken.is_set()


def test_a_request_waiting_for_room_to_decode_lets_the_next_go():
    """A small body waits for the decode budget in its turn only if there is room at once;
    otherwise the worker's other requests would all wait for the large bodies being decoded."""
    turns, budget, events = Turns(), DecodeBudget(capacity=10), []
    large_decoded, waiting = threading.Event(), threading.Event()

    def large() -> None:  # decoded out of turn, as the app does for a large body
        with budget.hold(10, time.monotonic() + 10):
            waiting.wait(10)
            large_decoded.wait(10)

    def small() -> None:
        with turns.turn():
            with budget.hold(5, time.monotonic() + 10, waiting=turns.paused):
                events.append("small decoded")

    def next_request() -> None:
        with turns.turn():
            events.append("next ran")
            large_decoded.set()

    threads = [threading.Thread(target=large), threading.Thread(target=small)]
    threads[0].start()
    threads[1].start()
    wait_until(lambda: budget._freed._waiters)  # the small body waits for room
    waiting.set()
    threads.append(threading.Thread(target=next_request))
    threads[-1].start()
    for thread in threads:
        thread.join(10)
    assert events == ["next ran", "small decoded"]


def test_a_model_call_runs_out_of_turn():
    """The request leading a model call gives its turn away for the call and for answering
    its batch: other requests decode meanwhile, and the model never idles while the leader
    waits for its turn to come round again."""
    turns, release, calls = Turns(), threading.Event(), []

    def predict(batch: np.ndarray) -> np.ndarray:
        calls.append(len(batch))
        release.wait(10)
        return batch * 2

    batcher = MicroBatcher(predict, max_batch_size=16, max_queue=16, paused=turns.paused)
    answers = {}

    def request(name: str, value: float) -> None:
        with turns.turn():
            answers[name] = batcher.submit(np.array([[value]], np.float32),
                                           time.monotonic() + 10)

    leader = threading.Thread(target=request, args=("leader", 1.0))
    leader.start()
    wait_until(lambda: calls == [1])  # its call runs...
    took_a_turn = threading.Event()

    def other() -> None:
        with turns.turn():  # ...and another request has a turn meanwhile
            took_a_turn.set()

    threading.Thread(target=other).start()
    assert took_a_turn.wait(5)
    release.set()
    leader.join(10)
    assert answers["leader"].tolist() == [[2.0]]
