"""Clients that stall or trickle, against the real `serve` on a real port: its intake
(serve.intake) in front of gunicorn.

One worker with 2 request threads and a 5 s request timeout. Each stall case opens 3 clients
(one more than the threads), and checks that `/ping` is answered while all of them are still
waiting, that each is cut at its deadline (408 for a body, the connection closed for a head),
and that the server then answers a valid request. The seconds each client was held are
printed (`pytest -s`); the test only fails when a client is held past the deadline by far.
"""

from __future__ import annotations

import json
import select
import socket
import time
from dataclasses import dataclass

import numpy as np
import pytest
import requests
from serve_testing import INTAKE_THREADS as THREADS
from serve_testing import INTAKE_TIMEOUT_S as TIMEOUT_S
from serve_testing import Server, expected_probabilities

MARGIN_S = 10  # far more than a busy machine needs to notice a deadline
ROW = b"1,2,3,4"
HEAD = (
    b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Type: text/csv\r\n"
    b"Accept: application/json\r\n"
)


@pytest.fixture
def server(intake_server):
    return intake_server


@dataclass
class Outcome:
    seconds: float  # from the client's first byte to the end of the connection
    answer: bytes  # all the server sent

    @property
    def status(self) -> int | None:
        """The first answer's status; None when the connection closed without one."""
        return int(self.answer.split()[1]) if self.answer else None

    @property
    def body(self) -> bytes:
        return self.answer.partition(b"\r\n\r\n")[2]


def connect(server: Server, first: bytes) -> tuple[socket.socket, float]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    started = time.monotonic()
    sock.sendall(first)
    return sock, started


def await_outcomes(
    clients: list[tuple[socket.socket, float]], trickle: bytes = b"", limit_s: float = 30
) -> list[Outcome]:
    """Read each client's answer until the server ends its connection; meanwhile send one
    byte of `trickle` a second on every connection still open. Fails once a client has been
    held for `limit_s`."""
    answers = {sock: b"" for sock, _ in clients}
    ended: dict[socket.socket, float] = {}
    first = min(started for _, started in clients)
    while len(ended) < len(clients):
        assert time.monotonic() - first < limit_s, f"clients still held after {limit_s} s"
        open_ = [sock for sock, _ in clients if sock not in ended]
        readable, _, _ = select.select(open_, [], [], 1.0)
        for sock in readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            answers[sock] += chunk
            if not chunk:
                ended[sock] = time.monotonic()
        for sock in open_:
            if trickle and sock not in ended and sock not in readable:
                try:
                    sock.send(trickle)
                except OSError:  # the server has closed it; its end is read next turn
                    pass
    for sock, _ in clients:
        sock.close()
    return [Outcome(round(ended[sock] - started, 2), answers[sock]) for sock, started in clients]


def nothing_answered(clients: list[tuple[socket.socket, float]]) -> bool:
    """No client has an answer, or the end of its connection, to read yet."""
    readable, _, _ = select.select([sock for sock, _ in clients], [], [], 0)
    return not readable


def answers_a_row(server: Server) -> None:
    answer = requests.post(
        server.url + "/invocations", data=ROW, timeout=30, headers={"Content-Type": "text/csv"}
    )
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(
        answer.json()["predictions"][0]["probabilities"],
        expected_probabilities([[1, 2, 3, 4]])[0],
        rtol=1e-5,
    )


# first bytes, then what is trickled (one byte a second; b"" stops after the first bytes),
# and the answer: 408 for a body, none (the connection closed) for a head.
STALLS = {
    "stops in its head": (HEAD, b"", None),
    "trickles its head": (HEAD + b"X-Slow: ", b"a", None),
    "stops in its body": (HEAD + b"Content-Length: 7\r\n\r\n1,2", b"", 408),
    "trickles its body": (HEAD + b"Content-Length: 1000\r\n\r\n1", b"1", 408),
    "stops in a chunked body": (HEAD + b"Transfer-Encoding: chunked\r\n\r\n7\r\n1,2", b"", 408),
}


@pytest.mark.parametrize("case", list(STALLS))
def test_a_stalled_client_is_cut_at_its_deadline_and_ping_answers_meanwhile(server, case):
    first, trickle, status = STALLS[case]
    clients = [connect(server, first) for _ in range(THREADS + 1)]
    ping = requests.get(server.url + "/ping", timeout=30)
    assert ping.status_code == 200
    assert nothing_answered(clients), "/ping was answered only after a stalled client was cut"
    outcomes = await_outcomes(clients, trickle)
    print(
        f"\n{case}: held {[outcome.seconds for outcome in outcomes]} s "
        f"against a {TIMEOUT_S} s deadline"
    )
    for outcome in outcomes:
        assert outcome.status == status, outcome
        if status == 408:
            assert json.loads(outcome.body)["error"].startswith(
                f"the request body had not fully arrived {TIMEOUT_S} s after the request began"
            )
        assert outcome.seconds < TIMEOUT_S + MARGIN_S
    answers_a_row(server)


def test_a_request_stalled_behind_a_whole_one_is_cut_at_its_deadline(server):
    """The start of a second request arrives with a whole first one: the intake passes the
    first on at once, and the deadline still cuts the second (no answer: its head is
    incomplete)."""
    clients = [
        connect(server, HEAD + b"Content-Length: 7\r\n\r\n" + ROW + HEAD)
        for _ in range(THREADS + 1)
    ]
    assert requests.get(server.url + "/ping", timeout=30).status_code == 200
    outcomes = await_outcomes(clients)
    print(
        f"\na head stalled behind a whole request: held {[o.seconds for o in outcomes]} s "
        f"against a {TIMEOUT_S} s deadline"
    )
    for outcome in outcomes:
        assert outcome.answer.count(b"HTTP/1.1 ") == 1 and outcome.status == 200, outcome
        assert outcome.seconds < TIMEOUT_S + MARGIN_S


def test_a_body_that_trickles_after_arriving_at_full_speed_is_cut_at_its_deadline(server):
    """64 KB at once is more than the intake waits for: a thread reads the rest as it comes
    (the one case where a stalled client holds a thread), and the deadline still ends it."""
    client = connect(server, HEAD + b"Content-Length: 1000000\r\n\r\n" + b"1,2,3,4\n" * 8192)
    [outcome] = await_outcomes([client], trickle=b"1")
    print(
        f"\na body trickling after 64 KB: held {outcome.seconds} s against a {TIMEOUT_S} s deadline"
    )
    assert outcome.status == 408, outcome
    assert outcome.seconds < TIMEOUT_S + MARGIN_S
    answers_a_row(server)


def test_a_body_sent_slowly_within_the_timeout_is_answered(server):
    client = connect(server, HEAD + b"Content-Length: 7\r\n\r\n")
    for byte in ROW:  # one byte every 0.4 s: 2.8 s of a 5 s deadline
        time.sleep(0.4)
        client[0].sendall(bytes([byte]))
    client[0].shutdown(socket.SHUT_WR)  # the server then ends the connection after its answer
    [outcome] = await_outcomes([client])
    assert outcome.status == 200, outcome
    np.testing.assert_allclose(
        json.loads(outcome.body)["predictions"][0]["probabilities"],
        expected_probabilities([[1, 2, 3, 4]])[0],
        rtol=1e-5,
    )


def test_a_body_its_client_ends_early_is_refused_not_decoded(server):
    """A CSV cut after a line would pass for a whole one: the declared length is checked."""
    client = connect(server, HEAD + b"Content-Length: 16\r\n\r\n1,2,3,4\n")
    client[0].shutdown(socket.SHUT_WR)
    [outcome] = await_outcomes([client])
    assert outcome.status == 400, outcome
    assert json.loads(outcome.body)["error"].startswith("the request body ended after 8 bytes")


def test_a_large_body_at_full_speed_and_pipelined_requests_are_answered(server):
    rows = b"\n".join([ROW] * 20_000)  # 160 KB: more than the intake looks at
    answer = requests.post(
        server.url + "/invocations",
        data=rows,
        timeout=30,
        headers={"Content-Type": "text/csv", "Accept": "text/csv"},
    )
    assert answer.status_code == 200, answer.text
    assert len(answer.text.splitlines()) == 20_000
    # Two requests in one send: gunicorn reads the second with the first and must serve it
    # from what it read, not wait for more from the client.
    request = HEAD + b"Content-Length: 7\r\n\r\n" + ROW
    client = connect(
        server, request + HEAD + b"Connection: close\r\nContent-Length: 7\r\n\r\n" + ROW
    )
    [outcome] = await_outcomes([client])
    assert outcome.answer.count(b"HTTP/1.1 200 OK\r\n") == 2, outcome


def test_a_client_that_waits_for_100_continue_gets_it(server):
    sock, _ = connect(
        server, HEAD + b"Expect: 100-continue\r\nContent-Length: 7\r\nConnection: close\r\n\r\n"
    )
    assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    sock.sendall(ROW)
    [outcome] = await_outcomes([(sock, time.monotonic())])
    assert outcome.status == 200, outcome
