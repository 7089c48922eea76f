"""Kept-alive connections on the real server (serve.keepalive): a request thread that keeps a
busy connection must never starve other connections, a connection is served correctly
whether its next request comes at once, after a pause, or pipelined behind the first, and
connections opened at once are shared evenly by the workers."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import requests

from serve.keepalive import LINGER_S
from serve_testing import INSTANCES, Server, expected_probabilities, wait_for, write_model

ROW = ",".join(str(v) for v in INSTANCES[0])


@pytest.fixture(scope="module")
def two_threads(tmp_path_factory):
    """Two workers with two request threads each, so that six clients outnumber them."""
    root = tmp_path_factory.mktemp("keepalive")
    write_model(root / "model")
    server = Server(root, root / "serve.log", SAGEMAKER_MODEL_SERVER_WORKERS="2",
                    SERVE_THREADS="2")
    server.models_ready(2)
    yield server
    server.stop()


def probabilities(answer: requests.Response) -> list[float]:
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"][0]["probabilities"]


def test_more_busy_connections_than_threads_are_all_served(two_threads):
    """Six clients, each sending its next request as soon as it has the answer, share two
    threads: each gets answers all along, none waits for the others to stop."""
    expected = expected_probabilities([INSTANCES[0]])[0]
    stop_at = time.monotonic() + 3
    answered, errors = [0] * 6, []

    def client(index: int) -> None:
        with requests.Session() as session:
            while time.monotonic() < stop_at:
                try:
                    answer = session.post(two_threads.url + "/invocations", data=ROW,
                                          headers={"Content-Type": "text/csv"}, timeout=2)
                    np.testing.assert_allclose(probabilities(answer), expected, rtol=1e-5)
                except Exception as error:  # noqa: BLE001 - reported below
                    errors.append(f"client {index}: {error!r}")
                    return
                answered[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert min(answered) >= 10, f"answers per client: {answered}"


def test_a_connection_quiet_for_a_while_is_still_served(two_threads):
    connection = socket.create_connection(("127.0.0.1", two_threads.port), timeout=10)
    with connection, connection.makefile("rb") as stream:
        for pause_s in (0, 20 * LINGER_S, 0):
            time.sleep(pause_s)
            connection.sendall(request())
            assert read_answer(stream).startswith(b"HTTP/1.1 200")


def test_pipelined_requests_are_answered_in_order(two_threads):
    """Three requests in one send: the second and third wait in the parser's buffer, not on
    the socket, and must still be answered, in order."""
    rows = INSTANCES
    connection = socket.create_connection(("127.0.0.1", two_threads.port), timeout=10)
    with connection, connection.makefile("rb") as stream:
        connection.sendall(b"".join(request(",".join(map(str, row))) for row in rows))
        answers = [read_answer(stream) for _ in rows]
    for answer, row in zip(answers, rows):
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200"), answer
        np.testing.assert_allclose(probabilities_from(body), expected_probabilities([row])[0],
                                   rtol=1e-5)


@pytest.mark.parametrize("trial", range(3))
def test_connections_opened_at_once_are_shared_evenly_by_the_workers(two_threads, trial):
    """64 clients connecting at once and each sending a request at once, as a load generator
    or a load balancer's pool does. Every worker is woken for each new connection and the
    first to accept it gets it; a kept-alive connection then stays with its worker for good,
    so an uneven split (gunicorn's own was 45/19 to 53/11 here) makes the busier worker slow
    for as long as the clients stay. Each connection asks which worker holds it. The workers
    start idle: a connection being closed still counts until its worker has closed it."""
    wait_for(lambda: not server_side_connections(two_threads.port),
             "the workers to close the connections of earlier tests")
    connections = [socket.create_connection(("127.0.0.1", two_threads.port), timeout=30)
                   for _ in range(64)]
    try:
        for connection in connections:
            connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        holders = Counter()
        for connection in connections:
            with connection.makefile("rb") as stream:
                answer = read_answer(stream)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            holders[json.loads(answer.split(b"\r\n\r\n", 1)[1])["pid"]] += 1
    finally:
        for connection in connections:
            connection.close()
    assert len(holders) == 2 and max(holders.values()) - min(holders.values()) <= 8, holders


def metrics_pid(connection: socket.socket, stream) -> int:
    connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
    return json.loads(read_answer(stream).split(b"\r\n\r\n", 1)[1])["pid"]


def test_a_client_slow_to_send_or_to_read_holds_back_no_other_request(two_threads):
    """A worker's requests take turns at their Python work (serve.turns); a request whose
    client stops sending its body, or stops reading a large answer, must give its turn away
    while it waits, or every other request on its worker waits with it."""
    slow = socket.create_connection(("127.0.0.1", two_threads.port), timeout=30)
    slow_stream = slow.makefile("rb")
    worker = metrics_pid(slow, slow_stream)
    others = []  # connections until one is on the same worker
    while len(others) < 40 and (not others or others[-1][2] != worker):
        connection = socket.create_connection(("127.0.0.1", two_threads.port), timeout=5)
        stream = connection.makefile("rb")
        others.append((connection, stream, metrics_pid(connection, stream)))
    other, other_stream, pid = others[-1]
    assert pid == worker, "no second connection reached the slow client's worker"

    def answered_meanwhile() -> None:
        for _ in range(5):
            other.sendall(request())  # times out after 5 s if held back
            assert read_answer(other_stream).startswith(b"HTTP/1.1 200")

    try:
        half = len(request()) - len(ROW) // 2
        slow.sendall(request()[:half])  # the body's second half never comes, for now
        time.sleep(0.2)
        answered_meanwhile()
        slow.sendall(request()[half:])
        assert read_answer(slow_stream).startswith(b"HTTP/1.1 200")

        rows = "\n".join([ROW] * 60_000)  # a 1 MB body, a 7 MB answer the client leaves unread
        slow.sendall(request(rows))
        time.sleep(1)
        answered_meanwhile()
        answer = read_answer(slow_stream)
        assert answer.startswith(b"HTTP/1.1 200") and len(answer) > 5_000_000
    finally:
        for connection, stream, _ in others:
            stream.close()
            connection.close()
        slow_stream.close()
        slow.close()


def server_side_connections(port: int) -> list[str]:
    """The kernel's TCP entries of connections the server on `port` still holds: established,
    or closed by the client and not yet by the server (CLOSE_WAIT, LAST_ACK)."""
    entries = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state in ("01", "08", "09"):
                entries.append(line)
    return entries


def request(row: str = ROW) -> bytes:
    return (f"POST /invocations HTTP/1.1\r\nHost: test\r\nContent-Type: text/csv\r\n"
            f"Content-Length: {len(row)}\r\n\r\n{row}").encode()


def read_answer(stream) -> bytes:
    """One HTTP response (with a Content-Length) read from the connection's file."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = stream.readline()
        if not line:
            pytest.fail(f"connection closed after {head!r}")
        head += line
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    return head + stream.read(length)


def probabilities_from(body: bytes) -> list[float]:
    return json.loads(body)["predictions"][0]["probabilities"]
