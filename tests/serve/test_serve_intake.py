"""The intake's verdict on the start of a receive buffer: wait, whole, or read as it comes.

The one mistake that matters is WHOLE for a request that is not: its thread would then wait
for the rest with no deadline. So every request that is not plainly whole and well framed is
expected to be WAIT or STREAM.
"""

from __future__ import annotations

import logging
import socket
import time

import pytest

from serve import intake
from serve.intake import PEEK_BYTES, Verdict, verdict

HEAD = b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Type: text/csv\r\n"


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", Verdict.WHOLE),  # the end of the stream: a thread finds it at once
        (b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n", Verdict.WHOLE),
        (b"GET /ping HTTP/1.0\r\n\r\n", Verdict.WHOLE),
        (b"GET /ping HTTP/1.1\r\nHost: t\r\n", Verdict.WAIT),
        (b"GET /pi", Verdict.WAIT),
        (HEAD + b"Content-Length: 7\r\n\r\n1,2,3,4", Verdict.WHOLE),
        (HEAD + b"content-LENGTH:7 \r\n\r\n1,2,3,4", Verdict.WHOLE),
        (HEAD + b"Content-Length: 7\r\n\r\n1,2", Verdict.WAIT),
        (HEAD + b"Content-Length: 7\r\n\r\n", Verdict.WAIT),
        (HEAD + b"Content-Length: 0\r\n\r\n", Verdict.WHOLE),
        # The next request, pipelined behind a whole one, does not make it less whole.
        (HEAD + b"Content-Length: 3\r\n\r\n1,2GET /ping HTTP/1.1\r\n", Verdict.WHOLE),
        # Framing gunicorn refuses at once: a thread answers 400 without waiting.
        (HEAD + b"Content-Length: 7\r\nContent-Length: 7\r\n\r\n1,2", Verdict.STREAM),
        (HEAD + b"Content-Length: -1\r\n\r\n", Verdict.STREAM),
        (HEAD + b"Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n", Verdict.STREAM),
        (HEAD + b"Transfer-Encoding: gzip\r\n\r\n", Verdict.STREAM),
        (b"GET /ping HTTP/1.1\nHost: t\n\n", Verdict.STREAM),  # bare LF line ends
        (b"\r\nGET /ping HTTP/1.1\r\n\r\n", Verdict.STREAM),  # a stray empty line first
        # The client waits for 100 Continue before it sends its body.
        (HEAD + b"Expect: 100-continue\r\nContent-Length: 7\r\n\r\n", Verdict.STREAM),
        # As much as the intake looks at: a client sending at full speed, read as it comes.
        (HEAD + b"Content-Length: 99999\r\n\r\n" + b"1" * PEEK_BYTES, Verdict.STREAM),
        (b"GET /ping HTTP/1.1\r\nX-Long: " + b"a" * PEEK_BYTES, Verdict.STREAM),
    ],
)
def test_verdict(data, expected):
    assert verdict(data[:PEEK_BYTES]) is expected


CHUNKED = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "body, expected",
    [
        (b"7\r\n1,2,3,4\r\n0\r\n\r\n", Verdict.WHOLE),
        (b"3;name=value\r\n1,2\r\n4\r\n,3,4\r\n0\r\n\r\n", Verdict.WHOLE),
        (b"7\r\n1,2,3,4\r\n0\r\nX-Trailer: 1\r\n\r\n", Verdict.WHOLE),
        (b"0\r\n\r\n", Verdict.WHOLE),
        (b"", Verdict.WAIT),
        (b"7\r\n1,2", Verdict.WAIT),
        (b"7\r\n1,2,3,4\r\n", Verdict.WAIT),
        (b"7\r\n1,2,3,4\r\n0\r\n", Verdict.WAIT),  # the empty line after the trailers is to come
        (b"7\r\n1,2,3,4\r\n0\r\nX-Trailer: 1\r\n", Verdict.WAIT),
        (b"z\r\n1,2\r\n0\r\n\r\n", Verdict.STREAM),  # not a hexadecimal size
        (b"0x3\r\n1,2\r\n0\r\n\r\n", Verdict.STREAM),
        (b"3\r\n1,2,3\r\n0\r\n\r\n", Verdict.STREAM),  # more data than its size says
    ],
)
def test_verdict_on_a_chunked_body(body, expected):
    assert verdict(CHUNKED + body) is expected


def test_a_length_of_more_digits_than_int_reads_goes_to_a_thread():
    """int() refuses a string of more than 4300 digits: the verdict must not call it."""
    assert verdict(HEAD + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n") is Verdict.STREAM
    assert verdict(HEAD + b"Content-Length: " + b"9" * 19 + b"\r\n\r\n1") is Verdict.STREAM
    assert verdict(HEAD + b"Content-Length: " + b"9" * 18 + b"\r\n\r\n1") is Verdict.WAIT


class Connection:
    """What the intake reads of gthread's connection: its socket and its parser (none before
    the first request)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.parser = sock, None


def test_a_fault_on_one_connection_never_ends_the_worker_or_the_watcher(monkeypatch, caplog):
    """Faults injected where the intake looks at a request: on the worker's main thread (a new
    connection) and on the watcher (a waiting one, as the split Content-Length of 5000 digits
    did). Each is logged, its connection goes to a thread, and a request that arrives in
    pieces afterwards still reaches a thread as soon as it is whole."""
    looked = intake._look

    def faulty(conn):
        if b"X-Fault" in (intake.received(conn) or b""):
            raise RuntimeError("injected fault")
        return looked(conn)

    def faulty_verdict(data):
        if b"X-Verdict-Fault" in data:
            raise RuntimeError("injected fault")
        return verdict(data)

    monkeypatch.setattr(intake, "verdict", faulty_verdict)
    pool = intake.IntakePool(2, request_timeout_s=30, idle_timeout_s=30)
    served: list[bytes] = []
    pairs = [socket.socketpair() for _ in range(3)]

    def handle(conn):
        served.append(conn.sock.recv(65536))
        return False

    def serve(client, server, *pieces):
        client.sendall(pieces[0])
        future = pool.submit(handle, Connection(server))
        for piece in pieces[1:]:
            time.sleep(0.1)  # each piece reaches the watcher on its own
            client.sendall(piece)
        return future.result(timeout=10)

    try:
        with caplog.at_level(logging.ERROR, logger="serve.intake"):
            serve(*pairs[0], b"GET /ping HTTP/1.1\r\nX-Verdict-Fault: 1\r\n\r\n")
            monkeypatch.setattr(intake, "_look", faulty)
            serve(*pairs[1], b"GET /ping HTTP/1.1\r\n", b"X-Fault: 1\r\n\r\n")
            monkeypatch.setattr(intake, "_look", looked)
            serve(*pairs[2], b"GET /ping HTTP/1.1\r\n", b"Host: t\r\n", b"\r\n")
        assert pool._watcher is not None and pool._watcher.is_alive()
        assert served == [
            b"GET /ping HTTP/1.1\r\nX-Verdict-Fault: 1\r\n\r\n",
            b"GET /ping HTTP/1.1\r\nX-Fault: 1\r\n\r\n",
            b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n",
        ]
        faults = [record for record in caplog.records if record.exc_info]
        assert [record.getMessage() for record in faults] == [
            "the intake could not look at a request; a thread reads it as it comes",
            "the intake failed on a connection; a thread reads it as it comes",
        ]
        assert all(str(record.exc_info[1]) == "injected fault" for record in faults)
    finally:
        pool.shutdown()
        for pair in pairs:
            for sock in pair:
                sock.close()
