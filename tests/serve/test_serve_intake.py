"""The intake's framing of a request (wait, whole, or on as it comes), and the intake itself
against a stand-in for gunicorn.

The one mistake that matters is WHOLE for a request that is not: gunicorn would then wait
for the rest with no deadline, holding a thread. So every request that is not plainly whole
and well framed is expected to be WAIT or STREAM.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from serve import intake
from serve.intake import ARRIVED_HEADER, HOLD_BYTES, Intake, Verdict, arrived, frame, stamped

HEAD = b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Type: text/csv\r\n"


@pytest.mark.parametrize(
    "data, expected",
    [
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
        # Framing gunicorn refuses at once: it answers 400 without waiting.
        (HEAD + b"Content-Length: 7\r\nContent-Length: 7\r\n\r\n1,2", Verdict.STREAM),
        (HEAD + b"Content-Length: -1\r\n\r\n", Verdict.STREAM),
        (HEAD + b"Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n", Verdict.STREAM),
        (HEAD + b"Transfer-Encoding: gzip\r\n\r\n", Verdict.STREAM),
        (b"GET /ping HTTP/1.1\nHost: t\n\n", Verdict.STREAM),  # bare LF line ends
        (b"\r\nGET /ping HTTP/1.1\r\n\r\n", Verdict.STREAM),  # a stray empty line first
        # The client waits for 100 Continue before it sends its body.
        (HEAD + b"Expect: 100-continue\r\nContent-Length: 7\r\n\r\n", Verdict.STREAM),
        # As much as the intake holds: a client sending at full speed, passed on as it comes.
        (HEAD + b"Content-Length: 99999\r\n\r\n" + b"1" * HOLD_BYTES, Verdict.STREAM),
        (b"GET /ping HTTP/1.1\r\nX-Long: " + b"a" * HOLD_BYTES, Verdict.STREAM),
        # ... unless it has all arrived: then it goes on whole, however large.
        (HEAD + b"Content-Length: 99999\r\n\r\n" + b"1" * 99999, Verdict.WHOLE),
    ],
)
def test_verdict(data, expected):
    assert frame(data).verdict is expected


def test_a_whole_request_is_measured_so_that_the_next_one_is_looked_at_on_its_own():
    first = HEAD + b"Content-Length: 3\r\n\r\n1,2"
    assert frame(first + b"GET /ping HTTP/1.1\r\n").size == len(first)
    chunked = HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\n1,2\r\n0\r\n\r\n"
    assert frame(chunked + b"GET /ping").size == len(chunked)
    assert frame(b"GET /ping HTTP/1.1\r\n\r\nGET").size == len(b"GET /ping HTTP/1.1\r\n\r\n")
    # A request going on as it comes is counted, where its framing says how long it is.
    assert frame(HEAD + b"Expect: 100-continue\r\nContent-Length: 7\r\n\r\n").size == (
        len(HEAD) + len(b"Expect: 100-continue\r\nContent-Length: 7\r\n\r\n") + 7
    )
    assert frame(HEAD + b"Content-Length: -1\r\n\r\n").size is None


def test_the_arrival_is_stamped_after_the_request_line_and_read_back_never_later_than_now():
    request = b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n"
    assert stamped(request, frame(request).head_end, 12.5) == (
        b"GET /ping HTTP/1.1\r\n" + ARRIVED_HEADER.encode() + b": 12.500000\r\nHost: t\r\n\r\n"
    )
    assert stamped(b"\r\nGET /", -1, 12.5) == b"\r\nGET /"  # a head gunicorn refuses anyway
    key = "HTTP_X_SERVE_ARRIVED"
    assert arrived({key: "12.5"}) == 12.5
    assert arrived({key: "12.5,3.0"}) == 12.5  # a client's own header comes after the intake's
    assert arrived({key: "1e300"}) < 1e300  # a client's in the future cannot extend its deadline
    assert arrived({key: "x"}) == pytest.approx(arrived({}), abs=1.0)


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
    assert frame(CHUNKED + body).verdict is expected


def test_a_length_of_more_digits_than_int_reads_goes_on_at_once():
    """int() refuses a string of more than 4300 digits: the framing must not call it."""
    assert frame(HEAD + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n").verdict is Verdict.STREAM
    assert frame(HEAD + b"Content-Length: " + b"9" * 19 + b"\r\n\r\n1").verdict is Verdict.STREAM
    assert frame(HEAD + b"Content-Length: " + b"9" * 18 + b"\r\n\r\n1").verdict is Verdict.WAIT


async def _gunicorn_stand_in(received: list[bytes]) -> tuple[asyncio.Server, int]:
    """A stand-in for gunicorn on the loopback: it records each request it is passed (a head and
    no body here) and answers it with 200."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():
            try:
                received.append(await reader.readuntil(b"\r\n\r\n"))
            except (asyncio.IncompleteReadError, asyncio.CancelledError):
                return  # the intake closed the connection
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_fault_on_one_connection_never_ends_the_intake(monkeypatch, caplog):
    """A fault injected where the intake looks at a request is logged, that request goes on to
    gunicorn as it comes, and a request that arrives in pieces afterwards still goes on whole,
    stamped with its arrival, as soon as it is whole."""
    looked = intake.frame

    def faulty(data):
        if b"X-Fault" in data:
            raise RuntimeError("injected fault")
        return looked(data)

    monkeypatch.setattr(intake, "frame", faulty)
    received: list[bytes] = []

    async def main() -> list[bytes]:
        loop = asyncio.get_running_loop()
        upstream, port = await _gunicorn_stand_in(received)
        listener = socket.create_server(("127.0.0.1", 0))
        server = await Intake(loop, port, request_timeout_s=30, idle_timeout_s=30).serve(listener)
        answers = []
        for pieces in (
            [b"GET /ping HTTP/1.1\r\nX-Fault: 1\r\n\r\n"],
            [b"GET /ping HTTP/1.1\r\n", b"Host: t\r\n", b"\r\n"],
        ):
            reader, writer = await asyncio.open_connection(*listener.getsockname())
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.1)  # each piece reaches the intake on its own
            answers.append(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10))
            writer.close()
        server.close()
        upstream.close()
        return answers

    with caplog.at_level(logging.ERROR, logger="serve.intake"):
        answers = asyncio.run(main())
    assert answers == [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"] * 2
    assert received[0] == b"GET /ping HTTP/1.1\r\nX-Fault: 1\r\n\r\n"  # as it came
    assert received[1].startswith(b"GET /ping HTTP/1.1\r\n" + ARRIVED_HEADER.encode() + b": ")
    assert received[1].endswith(b"\r\nHost: t\r\n\r\n")
    faults = [record for record in caplog.records if record.name == "serve.intake"]
    assert [record.getMessage() for record in faults] == [
        "the intake could not look at a request; it goes on as it comes"
    ]
    assert str(faults[0].exc_info[1]) == "injected fault"
