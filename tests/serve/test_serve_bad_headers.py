"""Bad framing headers against the real `serve` on a real port: each is answered 400 or 413,
sent in one packet or split in two, and the worker and its intake (serve.intake) live on.

A Content-Length of more than 4300 digits made the intake's int() raise: in one packet, on
gunicorn's main thread, which ended the worker (exit 255, the model loaded again); split in
two, on the intake's watcher thread, which died, so that `/ping` still answered 200 while
every later request that arrived in pieces waited for ever. So every case here also checks
that the worker is the same process afterwards and that a request sent in pieces is answered.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests
from hypothesis import strategies as st
from serve_testing import INTAKE_TIMEOUT_S as TIMEOUT_S
from serve_testing import Server
from test_serve_slow_clients import HEAD, ROW, await_outcomes

from tests.fuzzing import fuzz

PAUSE_S = 0.2  # between the two packets of a split request: each reaches the server alone


@pytest.fixture
def server(intake_server):
    return intake_server


def worker_pid(server: Server) -> int:
    return requests.get(server.url + "/metrics", timeout=30).json()["pid"]


def send(server: Server, *packets: bytes):
    """Send `packets` on one connection, PAUSE_S apart (so each arrives on its own), and
    return the outcome once the server has ended the connection."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    started = time.monotonic()
    for index, packet in enumerate(packets):
        if index:
            time.sleep(PAUSE_S)
        sock.sendall(packet)
    [outcome] = await_outcomes([(sock, started)], limit_s=3 * TIMEOUT_S)
    return outcome


# The framing header lines, the status and the start of the error, if the app writes one
# (gunicorn answers a Content-Length it refuses with a 400 HTML page that names it).
CASES = {
    "more digits than int() reads (4300)": (b"Content-Length: " + b"9" * 5000, 400, None),
    "a length beyond any body": (
        b"Content-Length: " + b"9" * 30,
        413,
        "the request body is larger than 6 MB",
    ),
    "a negative length": (b"Content-Length: -7", 400, None),
    "a plus sign": (b"Content-Length: +7", 400, None),
    "Arabic-Indic digits": ("Content-Length: \u0661\u0662".encode(), 400, None),
    "two lengths": (b"Content-Length: 7\r\nContent-Length: 7", 400, None),
    "chunked and a length": (b"Transfer-Encoding: chunked\r\nContent-Length: 7", 400, None),
    "a length after blanks (allowed)": (b"Content-Length:    7", 200, None),
}


@pytest.mark.parametrize("packets", ["one packet", "two packets"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_length_is_answered_and_the_worker_lives_on(server, case, packets):
    lines, status, error = CASES[case]
    pid = worker_pid(server)
    request = HEAD + b"Connection: close\r\n" + lines + b"\r\n\r\n" + ROW
    cut = request.index(b"Content-Length") + len(b"Content-Length: ")
    parts = [request] if packets == "one packet" else [request[:cut], request[cut:]]
    outcome = send(server, *parts)
    assert outcome.status == status, (outcome, server.log.read_text()[-2000:])
    assert outcome.seconds < TIMEOUT_S, "answered only at the deadline"
    if error:
        assert json.loads(outcome.body)["error"].startswith(error), outcome
    elif status == 400:
        assert b"Invalid HTTP Header" in outcome.body and b"CONTENT-LENGTH" in outcome.body, outcome
    assert worker_pid(server) == pid, "the worker was replaced"
    # A valid request in pieces needs the intake's watcher thread to hand it over.
    split = send(server, HEAD + b"Connection: close\r\nContent-Len", b"gth: 7\r\n\r\n1,2", b",3,4")
    assert split.status == 200, split
    assert split.seconds < TIMEOUT_S, "a request in pieces was answered only at its deadline"


# Fuzzing the framing on the wire: Content-Length values (signs, blanks, digits of other
# scripts, more digits than int() reads), transfer codings, Expect, in any number and order,
# the request split in two packets anywhere; the client then ends its side, so that no
# request waits for its deadline.
length_values = st.one_of(
    st.integers(0, 10**40).map(str),
    st.text(
        st.sampled_from(list("0123456789+- \t,.xX\u0660\u0661\u00b2\u00bd\uff11")), max_size=12
    ),
    st.integers(4250, 4400).map(lambda digits: "9" * digits),
)
framing_lines = st.lists(
    st.one_of(
        length_values.map(lambda value: "Content-Length: " + value),
        st.sampled_from(
            [
                "Transfer-Encoding: chunked",
                "Transfer-Encoding: gzip, chunked",
                "Transfer-Encoding: chunked, chunked",
                "Transfer-Encoding: ",
                "Expect: 100-continue",
                "Content-Type: application/json",
                "Content-Length:",
                "Content-Length :7",
                "content-length: 7",
            ]
        ),
    ),
    max_size=4,
).map(lambda lines: "".join(line + "\r\n" for line in lines).encode())
bodies = st.one_of(
    st.sampled_from([ROW, b"7\r\n1,2,3,4\r\n0\r\n\r\n", b""]), st.binary(max_size=64)
)
# gunicorn answers 501 to a transfer coding it does not implement, as RFC 9112 asks.
UNIMPLEMENTED = b"Transfer-Encoding"


@fuzz(
    "serve request framing",
    max_examples=150,
    lines=framing_lines,
    body=bodies,
    split=st.integers(0, 10**4),
)
def test_any_framing_is_answered_without_a_server_error(server, lines, body, split):
    request = HEAD + b"Connection: close\r\n" + lines + b"\r\n" + body
    cut = split % (len(request) + 1)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    started = time.monotonic()
    sock.sendall(request[:cut])
    time.sleep(0.005)
    sock.sendall(request[cut:])
    sock.shutdown(socket.SHUT_WR)
    [outcome] = await_outcomes([(sock, started)], limit_s=TIMEOUT_S)
    statuses = [
        int(line.split()[1])
        for line in outcome.answer.split(b"\r\n")
        if line.startswith(b"HTTP/1.1 ")
    ]
    assert statuses, outcome  # the head is whole: something answers it
    for status in statuses:
        assert status < 500 or (status == 501 and UNIMPLEMENTED in lines), outcome


def test_the_worker_survived_the_fuzzing_and_logged_no_fault(server):
    """Runs after the fuzzing above (file order), on the same server."""
    log = server.log.read_text()
    assert "Traceback" not in log and '"level": "ERROR"' not in log, log[-3000:]
    assert log.count("Booting worker") == 1 and "Worker exiting" not in log, log[-3000:]
