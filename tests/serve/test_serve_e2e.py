"""End to end: the real `serve` command serving the real trainer's model over HTTP.

The model comes from `scripts/default_job.py` (the embedded digits job, a real 2-rank Horovod
run). The server is `serve --ml-root DIR` on a free port, as `docker run IMAGE serve` runs it.
To see /ping answer 503 before the model is loaded without racing the loader, the served
model directory's metadata.json is a FIFO: the loader blocks reading it until the test writes
the trainer's metadata into it.
"""

from __future__ import annotations

import errno
import http.client
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_testing import Server, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """An ml_root holding the model and data of the real default training job."""
    root = tmp_path_factory.mktemp("trained")
    job = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "default_job.py"),
            "--ml-root",
            str(root),
            "--epochs",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if job.returncode != 0:
        pytest.fail(f"the default training job failed:\n{(job.stdout + job.stderr)[-3000:]}")
    return root


@pytest.fixture(scope="module")
def digits(trained) -> tuple[np.ndarray, np.ndarray]:
    """The job's validation rows: (labels, 64 pixel values each)."""
    table = np.loadtxt(trained / "input" / "data" / "validation" / "digits.csv", delimiter=",")
    return table[:, 0].astype(int), table[:, 1:]


@pytest.fixture(scope="module")
def gated(trained, tmp_path_factory):
    """A server whose model directory is the trained one, but whose metadata.json the
    loader cannot read until `release` writes it."""
    ml_root = tmp_path_factory.mktemp("served")
    model_dir = ml_root / "model"
    model_dir.mkdir()
    (model_dir / "model").symlink_to(trained / "model" / "model")
    os.mkfifo(model_dir / "metadata.json")
    # One worker: the FIFO hands the metadata to one reader.
    server = Server(ml_root, ml_root / "serve.log", SAGEMAKER_MODEL_SERVER_WORKERS="1")
    metadata = (trained / "model" / "metadata.json").read_bytes()

    def release() -> None:
        def open_writer():
            try:
                return os.open(model_dir / "metadata.json", os.O_WRONLY | os.O_NONBLOCK)
            except OSError as error:
                if error.errno == errno.ENXIO:  # the loader has not opened it yet
                    return None
                raise

        if not getattr(server, "released", False):
            descriptor = wait_for(open_writer, "the model loader opening metadata.json")
            os.write(descriptor, metadata)
            os.close(descriptor)
            server.released = True

    server.release = release
    yield server
    server.stop()


@pytest.fixture
def server(gated) -> Server:
    gated.release()
    gated.healthy()
    return gated


def test_ping_is_503_until_the_model_is_loaded_then_200(gated):
    first = wait_for(lambda: gated.answer("GET", "/ping"), "the server accepting connections")
    assert (first.status_code, first.json()) == (
        503,
        {"error": "the model is still loading; retry when GET /ping answers 200"},
    )
    # A request that reaches a worker still loading waits for its model instead of failing
    # (with several workers, /ping may already answer 200 from another one).
    early = []
    sender = threading.Thread(
        target=lambda: early.append(
            gated.answer(
                "POST",
                "/invocations",
                data=",".join(["0"] * 64),
                headers={"Content-Type": "text/csv"},
            )
        )
    )
    sender.start()
    sender.join(timeout=2)
    assert sender.is_alive() and not early, "the request was answered before the model loaded"
    gated.release()
    gated.healthy()
    sender.join(timeout=60)
    assert early and early[0].status_code == 200, early
    assert gated.answer("GET", "/ping").content == b""


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_every_format_gives_the_trained_models_answers(server, digits):
    labels, pixels = digits
    csv_body = "\n".join(",".join(f"{v:g}" for v in row) for row in pixels)
    answer = server.answer(
        "POST", "/invocations", data=csv_body, headers={"Content-Type": "text/csv"}
    )
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    classes = np.array([p["class"] for p in predictions])
    assert (classes == labels).mean() >= 0.85  # the job reaches about 0.97 in 2 epochs
    probabilities = np.array([p["probabilities"] for p in predictions])
    assert classes.tolist() == probabilities.argmax(axis=1).tolist()

    others = {
        "application/json": json.dumps({"instances": pixels.tolist()}),
        "application/jsonlines": "\n".join(json.dumps(row) for row in pixels.tolist()),
        "application/x-npy": npy(pixels.astype(np.float32)),
    }
    for content_type, body in others.items():
        for accept in ("application/x-npy", "text/csv"):
            other = server.answer(
                "POST",
                "/invocations",
                data=body,
                headers={"Content-Type": content_type, "Accept": accept},
            )
            assert other.status_code == 200, (content_type, other.text)
            if accept == "text/csv":
                table = np.loadtxt(other.text.splitlines(), delimiter=",")
                assert table[:, 0].astype(int).tolist() == classes.tolist()
                other_probabilities = table[:, 1:]
            else:
                other_probabilities = np.load(io.BytesIO(other.content))
            np.testing.assert_allclose(other_probabilities, probabilities, atol=1e-5)


def test_the_exported_savedmodel_runs_without_keras_and_matches_the_server(
    server, trained, digits, tmp_path
):
    """What TensorFlow Serving or any SavedModel consumer sees: a serving_default signature
    with a named input of any batch size, in TF Serving's <name>/<version> layout."""
    from tests.portable import call_savedmodel

    _, pixels = digits
    rows = pixels[:20].astype(np.float32)
    called = call_savedmodel(trained / "model" / "model" / "1", rows, tmp_path)
    assert called["input"] == ["inputs", [None, 64], "float32"]
    served = server.answer("POST", "/invocations", json={"instances": rows.tolist()}).json()
    np.testing.assert_allclose(
        called["outputs"]["outputs"], [p["probabilities"] for p in served["predictions"]], atol=1e-6
    )


def test_concurrent_clients_get_their_own_answers_from_shared_model_calls(server, digits):
    _, pixels = digits
    rows = pixels[:96]
    reference = np.array(
        [
            p["probabilities"]
            for p in server.answer(
                "POST", "/invocations", json={"instances": rows.tolist()}
            ).json()["predictions"]
        ]
    )
    before = server.answer("GET", "/metrics").json()
    clients, rounds = 16, 6
    start = threading.Barrier(clients)
    failures: list[str] = []

    def client(index: int) -> None:
        session = requests.Session()
        start.wait()
        for round_ in range(rounds):
            row = (index * rounds + round_) % len(rows)
            answer = session.post(
                server.url + "/invocations",
                timeout=60,
                data=",".join(f"{v:g}" for v in rows[row]),
                headers={"Content-Type": "text/csv"},
            )
            [prediction] = answer.json()["predictions"]
            if not np.allclose(prediction["probabilities"], reference[row], atol=1e-5):
                failures.append(f"client {index} row {row}: {prediction}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[:3]
    after = server.answer("GET", "/metrics").json()
    assert after["requests"] - before["requests"] == clients * rounds
    # Shared calls happened: fewer model calls than requests, and one call held several.
    assert after["batches"] - before["batches"] < clients * rounds
    assert after["largest_batch_requests"] > 1


header_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    method=st.sampled_from(["POST", "GET", "PUT", "HEAD", "OPTIONS"]),
    path=st.sampled_from(["/invocations", "/ping", "/execution-parameters", "/%zz", "/"]),
    headers=st.dictionaries(
        st.sampled_from(
            ["Content-Type", "Accept", "X-Amzn-SageMaker-Custom-Attributes", "Content-Encoding"]
        ),
        header_values,
        max_size=4,
    ),
    body=st.binary(max_size=200) | st.just(b"1,2,3\n"),
)
def test_fuzzed_http_requests_never_make_the_server_fail(server, method, path, headers, body):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers)
        status = connection.getresponse().status
    finally:
        connection.close()
    assert status < 500
    assert server.answer("GET", "/ping").status_code == 200


def test_execution_parameters_match_what_is_accepted(server):
    assert server.answer("GET", "/execution-parameters").json() == {
        "MaxConcurrentTransforms": 8,
        "BatchStrategy": "MULTI_RECORD",
        "MaxPayloadInMB": 6,
    }
    too_big = server.answer(
        "POST",
        "/invocations",
        data=b"1" * (6 * 1024 * 1024 + 1),
        headers={"Content-Type": "text/csv"},
    )
    assert too_big.status_code == 413


def test_sigterm_stops_the_server_gracefully(server):
    """Last in this module: it ends the shared server."""
    assert server.stop() == 0
    log = server.log.read_text()
    assert "Shutting down: Master" in log
    # serve.host turns oneDNN off in the workers; TensorFlow says so at import when it is on
    assert "oneDNN custom operations are on" not in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    requests_logged = [line for line in lines if line["message"] == "request"]
    assert ("POST", "/invocations", 413) in {
        (line["method"], line["path"], line["status"]) for line in requests_logged
    }
    assert all(
        line["status"] >= 400 and isinstance(line["latency_ms"], float) for line in requests_logged
    ), "a successful request was logged"


def test_a_missing_model_is_reported_and_the_server_stays_up(tmp_path):
    server = Server(tmp_path, tmp_path / "serve.log")
    try:

        def failed() -> requests.Response | None:
            answer = server.answer("GET", "/ping")
            return answer if answer is not None and "failed" in answer.json()["error"] else None

        answer = wait_for(failed, "/ping reporting the failed load")
        assert answer.status_code == 503
        assert answer.json()["error"] == (
            f"the model failed to load: no model to serve: {tmp_path}/model does not exist; "
            "SageMaker unpacks the model artifact (model.tar.gz) there"
        )
        assert server.answer("GET", "/ping").status_code == 503  # still up, still saying why
        assert "the model cannot be served, /ping stays 503" in server.log.read_text()
    finally:
        assert server.stop() == 0
