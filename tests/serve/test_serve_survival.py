"""The real `serve` on a real port under a model call that hangs, a flood, and hostile bodies.

The hanging model is a real SavedModel: a classifier whose graph reads a FIFO whenever an input
value is above 1000, so its call blocks until the test opens the FIFO for writing, as a model
stuck on I/O or a deadlock would. Once released the read fails (a FIFO cannot be seeked), so
the stuck request itself ends in a 500; every other request is answered normally.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import requests
from serve_testing import METADATA, Server, expected_probabilities, wait_for

HANG = [5000.0, 0.0, 0.0, 0.0]  # any value above 1000 blocks the model's call
ROW = "1,2,3,4"


def write_gated_model(model_dir: Path, fifo: Path) -> None:
    """The test classifier's shape and classes, behind a gate that reads `fifo` on a HANG row."""
    import tensorflow as tf
    from serve_testing import BIAS, INPUT_SHAPE, KERNEL

    class Gate(tf.keras.layers.Layer):
        def call(self, x):
            # The path is computed from the input, so graph optimisation cannot fold the read.
            path = tf.strings.substr(
                tf.strings.join([str(fifo), tf.strings.as_string(tf.reduce_sum(x))]),
                0,
                len(str(fifo)),
            )
            waited = tf.cond(
                tf.reduce_any(x > 1000.0),
                lambda: tf.strings.length(tf.io.read_file(path)),
                lambda: tf.constant(0),
            )
            return x + tf.cast(waited, x.dtype) * 0.0

    inputs = tf.keras.Input(INPUT_SHAPE)
    dense = tf.keras.layers.Dense(len(KERNEL[0]), activation="softmax")
    model = tf.keras.Model(inputs, dense(Gate()(tf.keras.layers.Flatten()(inputs))))
    dense.set_weights([KERNEL, BIAS])
    model.save(str(model_dir / "model"), save_format="tf", include_optimizer=False)
    (model_dir / "metadata.json").write_text(json.dumps(METADATA))


@pytest.fixture(scope="module")
def gated_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gated")
    os.mkfifo(root / "gate")
    write_gated_model(root / "model", root / "gate")
    return root


def release(gate: Path) -> None:
    """Let a blocked read of the gate through (a writer opens and closes it); no-op if no read
    is waiting."""
    try:
        os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as error:
        if error.errno != errno.ENXIO:  # ENXIO: nothing is reading the gate
            raise


def post(
    server: Server, body: str | bytes, content_type: str = "text/csv", **headers: str
) -> requests.Response:
    return requests.post(
        server.url + "/invocations",
        data=body,
        timeout=600,
        headers={"Content-Type": content_type, **headers},
    )


@contextmanager
def stuck_server(gated_root: Path, log: Path, timeout_s: int) -> Iterator[Server]:
    """One worker with a queue of 2, its model call stuck until the gate is released."""
    server = Server(
        gated_root,
        log,
        SAGEMAKER_MODEL_SERVER_WORKERS="1",
        SAGEMAKER_MODEL_SERVER_TIMEOUT=str(timeout_s),
        SERVE_MAX_QUEUE="2",
    )
    try:  # stopped whatever fails, setting up included: it would outlive the tests
        server.healthy()
        with ThreadPoolExecutor(1) as pool:
            hung = pool.submit(post, server, ",".join(map(str, HANG)))
            wait_for(
                lambda: metrics(server)["model_call_running_s"] > 0,
                "the model call getting stuck",
                timeout_s=60,
            )
            try:
                yield server
            finally:
                release(gated_root / "gate")
                assert hung.result().status_code == 500  # the released read fails
    finally:
        server.stop()


def metrics(server: Server) -> dict:
    return server.answer("GET", "/metrics").json()


@pytest.fixture
def stuck(gated_root, tmp_path):
    """A 2 s request timeout."""
    with stuck_server(gated_root, tmp_path / "serve.log", timeout_s=2) as server:
        yield server


def test_a_hung_call_fails_waiting_requests_at_their_deadline_then_ping(stuck, gated_root):
    waiting = post(stuck, ROW)
    assert waiting.status_code == 503
    assert waiting.json()["error"].startswith("no prediction within 2 s")
    ping = wait_for(
        lambda: (lambda r: r if r.status_code == 503 else None)(stuck.answer("GET", "/ping")),
        "/ping turning 503",
        timeout_s=30,
    )
    assert "a model call has not returned for" in ping.json()["error"]
    refused = post(stuck, ROW)  # now new requests are refused at once, not queued
    assert refused.status_code == 503
    assert "a model call has not returned for" in refused.json()["error"]
    assert metrics(stuck)["timed_out"] == 1  # the first request only: this one never queued
    release(gated_root / "gate")
    wait_for(
        lambda: stuck.answer("GET", "/ping").status_code == 200,
        "/ping back to 200 once the call returned",
        timeout_s=30,
    )
    answer = post(stuck, ROW, Accept="application/json")
    np.testing.assert_allclose(
        answer.json()["predictions"][0]["probabilities"],
        expected_probabilities([[1, 2, 3, 4]])[0],
        rtol=1e-5,
    )
    counts = metrics(stuck)
    # The timed-out request was dropped, never computed: the only successful call is the last
    # request's (the stuck call failed, so it counts no batch).
    assert (counts["batches"], counts["requests"], counts["timed_out"]) == (1, 1, 1)


def test_a_full_queue_answers_503_with_retry_after_at_once(gated_root, tmp_path):
    with (
        stuck_server(gated_root, tmp_path / "serve.log", timeout_s=60) as server,
        ThreadPoolExecutor(2) as pool,
    ):
        queued = [pool.submit(post, server, ROW) for _ in range(2)]
        wait_for(
            lambda: metrics(server)["requests_waiting"] == 2, "two requests queued", timeout_s=30
        )
        refused = post(server, ROW)
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1"
        assert "SERVE_MAX_QUEUE=2" in refused.json()["error"]
        release(gated_root / "gate")
        assert [future.result().status_code for future in queued] == [200, 200]
        assert metrics(server)["refused"] == 1


@pytest.fixture(scope="module")
def small_limit(gated_root, tmp_path_factory):
    """Two workers, a 1 MB body limit, time enough for a slow machine to decode 64 MB."""
    server = Server(
        gated_root,
        tmp_path_factory.mktemp("limit") / "serve.log",
        SAGEMAKER_MODEL_SERVER_WORKERS="2",
        SAGEMAKER_MAX_PAYLOAD_IN_MB="1",
        SAGEMAKER_MODEL_SERVER_TIMEOUT="600",
    )
    server.models_ready(2)
    yield server
    server.stop()


def test_a_body_over_the_limit_gets_a_413_the_client_reads(small_limit):
    body = ("1,2,3,4\n" * 400_000).encode()  # 3.2 MB
    answer = post(small_limit, body)  # requests sends it all, then reads: no reset
    assert answer.status_code == 413
    assert "larger than 1 MB" in answer.json()["error"]
    chunked = requests.post(
        small_limit.url + "/invocations",
        data=iter([body]),
        timeout=60,
        headers={"Content-Type": "text/csv"},
    )  # no Content-Length
    assert chunked.status_code == 413


def test_a_costly_charset_is_refused_at_once(small_limit):
    answer = post(small_limit, b"1-" + b"z" * 500_000, "text/csv; charset=punycode")
    assert answer.status_code == 415, answer.text
    assert answer.json()["error"].startswith("charset 'punycode' is not supported")


@pytest.mark.parametrize(
    "shape", ["(-1, 4)", "(-3, -3)", "(0, 100000000000000000000)", "(1099511627776, 1099511627776)"]
)
def test_an_npy_header_with_impossible_dimensions_is_a_400(small_limit, shape):
    header = (f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}").encode()
    header = header.ljust(117) + b"\n"
    body = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(36)
    answer = post(small_limit, body, "application/x-npy")
    assert answer.status_code == 400, answer.text
    assert "every dimension must be between 0 and" in answer.json()["error"]


def test_many_large_bodies_at_once_are_decoded_within_the_budget(small_limit):
    """32 concurrent 1 MB CSV posts are all answered, while each worker decodes at most its
    budget (twice the 1 MB limit) of bodies at once, not 32 MB: the memory a body takes while
    parsed (about 14 times its size) is what the budget bounds."""
    rows = "\n".join(["1,2,3,4"] * 130_000).encode()  # just under 1 MB
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda _: post(small_limit, rows, Accept="text/csv"), range(32)))
    assert {answer.status_code for answer in answers} == {200}, [
        answer.text[:300] for answer in answers if answer.status_code != 200
    ][:3]
    assert all(len(answer.text.splitlines()) == 130_000 for answer in answers)
    peaks = {}
    while len(peaks) < 2:  # both workers
        counts = metrics(small_limit)
        peaks[counts["pid"]] = counts["decoding_peak_bytes"]
    assert max(peaks.values()) <= 2 * 1024 * 1024
    assert sum(peaks.values()) >= len(rows)  # the posts were decoded under the budget


def thread_cores(pid: int) -> dict[int, set[int]]:
    """The cores each thread of process `pid` may run on, by thread id."""
    return {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to place")
def test_each_worker_runs_its_python_on_a_core_of_its_own_and_its_model_on_all(small_limit):
    workers: set[int] = set()
    while len(workers) < 2:  # a new connection each time: the kernel spreads them
        assert post(small_limit, ROW).status_code == 200
        workers.add(metrics(small_limit)["pid"])
    every_core = os.sched_getaffinity(small_limit.process.pid)
    python_cores = []
    for pid in workers:
        threads = thread_cores(pid)
        [core] = threads[pid]  # the main thread, which started the request threads
        python_cores.append(core)
        assert sum(cores == {core} for cores in threads.values()) >= 2  # and request threads
        assert sum(cores == every_core for cores in threads.values()) >= 2  # TensorFlow's
    assert len(set(python_cores)) == 2
