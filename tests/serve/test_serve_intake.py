"""The intake's verdict on the start of a receive buffer: wait, whole, or read as it comes.

The one mistake that matters is WHOLE for a request that is not: its thread would then wait
for the rest with no deadline. So every request that is not plainly whole and well framed is
expected to be WAIT or STREAM.
"""

from __future__ import annotations

import pytest

from serve.intake import PEEK_BYTES, Verdict, verdict

HEAD = b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Type: text/csv\r\n"


@pytest.mark.parametrize("data, expected", [
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
])
def test_verdict(data, expected):
    assert verdict(data[:PEEK_BYTES]) is expected


CHUNKED = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("body, expected", [
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
])
def test_verdict_on_a_chunked_body(body, expected):
    assert verdict(CHUNKED + body) is expected
