"""The intake: a small asyncio proxy in front of gunicorn that passes a request on only once it
has all arrived, and never lets one wait past its deadline, SAGEMAKER_MODEL_SERVER_TIMEOUT
after its first byte.

Why: gunicorn's threaded worker hands each connection to a request thread as soon as it is
readable, and the thread then reads the request with blocking reads that have no deadline: a
client that stopped in the middle of its headers held a thread until it hung up, one that
sent a byte a second held it until its body was in. Enough such clients (one per thread) left
no thread for `/ping`, and SageMaker replaces an instance whose pings go unanswered. gunicorn
has no setting or hook for this (`pre_request` runs once the headers are read), and a socket
timeout bounds one read, not a request. So, as AWS's own serving containers put a buffering
proxy (nginx) in front of gunicorn, `serve` puts this intake on the public port and gunicorn's
stock workers behind it on a loopback port (serve.server): gunicorn is used through its
documented settings only.

Each client connection gets its own connection to gunicorn, opened with its first request, and
the intake relays gunicorn's answers back unchanged. Of the client's bytes it looks at each
request's framing (`frame`):

- The whole request (its headers and the body they declare, by Content-Length or chunked) has
  arrived: it goes to gunicorn at once, with one header added after the request line,
  ARRIVED_HEADER, when its first byte arrived (the deadline the app keeps, serve.app, counts
  from it). Requests pipelined behind it follow the same way.
- Part of it is still to come: it waits here, on no thread, until it is whole or its deadline
  comes. At the deadline a request whose headers have not all arrived is dropped and its
  connection closed without an answer; one whose body has not is passed on as far as it
  arrived and its connection to gunicorn ended (shut for writing), so the app finds the body
  cut short past its deadline and answers 408 (serve.app). Either way the connection ends once
  gunicorn has answered what it had.
- It cannot wait to be whole: HOLD_BYTES have arrived (a large body at full speed; holding
  more per connection would multiply memory by the connections), the client waits for
  gunicorn's `100 Continue` before it sends its body, or the framing is one gunicorn refuses at
  once. It goes on as it comes; at its deadline, if it has still not all been passed on, its
  connection to gunicorn is ended the same way. A request whose end cannot be counted (a
  chunked body over HOLD_BYTES, bad framing) ends the connection at its deadline whatever
  follows it.

A connection that has sent nothing yet is idle, not a request: it is closed after gunicorn's
keep-alive time. Between requests gunicorn keeps the connection behind it alive as long, and
when gunicorn closes it the intake closes the client's.

One event loop, in the `serve` process (gunicorn's master and workers are its child), serves
every connection: looking at a request is a few string searches on its first bytes, and
relaying costs two reads and two writes of the loopback per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

# How much of a request is held until it is whole. Bodies at full speed pass this in the first
# read or two; a client that trickles its first 16 KB has held no thread while doing so.
HOLD_BYTES = 16 * 1024
# When the request's first byte arrived (time.monotonic(), the same clock in every process),
# for the app's deadline. The intake's comes first: a client's own one comes after it.
ARRIVED_HEADER = "X-Serve-Arrived"
_ARRIVED_ENVIRON = "HTTP_" + ARRIVED_HEADER.upper().replace("-", "_")
_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]+")
# A Content-Length of more digits is larger than any body a client sends (10^18 bytes), so
# waiting for it is pointless, and int() refuses a string of more than 4300 digits
# (sys.get_int_max_str_digits): such a request goes to gunicorn at once, where gunicorn answers
# 400 to a length it cannot read and the app 413 to one over the payload limit.
MAX_LENGTH_DIGITS = 18
# A connection ending on the intake's side is closed as gunicorn closes its own (RFC 9112
# section 9.6): its sending side first, then what the client still sends is read and dropped,
# up to LINGER_BYTES or for LINGER_S, so that the kernel does not reset the connection (which
# can drop the answer before the client reads it) for bytes left unread.
LINGER_S = 2.0
LINGER_BYTES = 64 * 1024

log = logging.getLogger(__name__)


class Verdict(Enum):
    """What the start of a connection's next request says about it."""

    WAIT = "part of the request is still to come"
    WHOLE = "the whole request has arrived"
    STREAM = "the request goes on as it comes"


@dataclass(frozen=True)
class Framing:
    """The verdict on a request, its size in bytes (head and body) where it is known, and where
    its head ends (the index of its blank line; -1 while unknown or malformed)."""

    verdict: Verdict
    size: int | None = None
    head_end: int = -1


def frame(data: bytes) -> Framing:
    """The framing of the request `data` starts with. Anything unusual is STREAM, never WHOLE: a
    request passed on as whole when it is not would wait in gunicorn for the rest with no
    deadline, holding a thread."""
    if data.startswith(b"\r\n"):
        return Framing(Verdict.STREAM)
    end = data.find(b"\r\n\r\n")
    head = data if end < 0 else data[: end + 2]  # each header line then ends with CRLF
    if head.count(b"\n") != head.count(b"\r\n"):
        return Framing(Verdict.STREAM)  # a bare LF: gunicorn refuses the head at once
    if end < 0:
        return Framing(Verdict.STREAM if len(data) >= HOLD_BYTES else Verdict.WAIT)
    body_start = end + 4
    head = head.lower()
    lengths = _values(head, b"content-length")
    if b"\r\ntransfer-encoding:" in head:
        if _values(head, b"transfer-encoding") != [b"chunked"] or lengths:
            return Framing(Verdict.STREAM, None, end)
        found, body_size = chunked_verdict(data[body_start:])
        if found is Verdict.WHOLE:
            return Framing(found, body_start + body_size, end)
        return Framing(_held(found, data), None, end)
    if not lengths:
        return Framing(Verdict.WHOLE, body_start, end)
    if len(lengths) > 1 or not lengths[0].isdigit() or len(lengths[0]) > MAX_LENGTH_DIGITS:
        return Framing(Verdict.STREAM, None, end)
    size = body_start + int(lengths[0])
    if len(data) >= size:
        return Framing(Verdict.WHOLE, size, end)
    if b"\r\nexpect:" in head:  # the client waits for 100 Continue before sending its body
        return Framing(Verdict.STREAM, size, end)
    return Framing(_held(Verdict.WAIT, data), size, end)


def _held(found: Verdict, data: bytes) -> Verdict:
    """WAIT while less than HOLD_BYTES of the request has arrived, else STREAM."""
    return Verdict.STREAM if found is Verdict.WAIT and len(data) >= HOLD_BYTES else found


def chunked_verdict(body: bytes) -> tuple[Verdict, int]:
    """WHOLE and the chunked body's size once `body` holds its last chunk and the empty line
    after its trailers; STREAM when its framing is malformed (gunicorn answers that at once)."""
    position = 0
    while (line_end := body.find(b"\r\n", position)) >= 0:
        size = body[position:line_end].partition(b";")[0].strip(b" \t")
        if not _CHUNK_SIZE.fullmatch(size):
            return Verdict.STREAM, 0
        if int(size, 16) == 0:
            trailers_end = body.find(b"\r\n\r\n", line_end)
            if trailers_end < 0:
                return Verdict.WAIT, 0
            return Verdict.WHOLE, trailers_end + 4
        position = line_end + 2 + int(size, 16) + 2
        if position > len(body):
            return Verdict.WAIT, 0
        if body[position - 2 : position] != b"\r\n":
            return Verdict.STREAM, 0
    return Verdict.WAIT, 0


def _values(head: bytes, name: bytes) -> list[bytes]:
    """The values of header `name` in `head` (lower-cased, every header line ending in CRLF)."""
    key, values = b"\r\n" + name + b":", []
    start = head.find(key)
    while start >= 0:
        line_end = head.find(b"\r\n", start + len(key))
        values.append(head[start + len(key) : line_end].strip(b" \t"))
        start = head.find(key, line_end)
    return values


def stamped(data: bytes, head_end: int, arrived: float) -> bytes:
    """`data` with ARRIVED_HEADER after its request line (when its head could be read)."""
    line_end = data.find(b"\r\n")
    if head_end < 0 or not 0 < line_end <= head_end:
        return data
    header = f"{ARRIVED_HEADER}: {arrived:.6f}\r\n".encode()
    return data[: line_end + 2] + header + data[line_end + 2 :]


def arrived(environ: Mapping[str, object]) -> float:
    """When the request in `environ` began (time.monotonic()): its first byte's arrival at the
    intake, never later than now; now for a request that did not come through the intake."""
    now = time.monotonic()
    value = environ.get(_ARRIVED_ENVIRON)
    if not isinstance(value, str):
        return now
    try:
        return min(float(value.partition(",")[0]), now)  # the intake's comes first
    except ValueError:
        return now


UNREACHABLE = "the server is starting or stopping; retry in a few seconds"
CONNECT_RETRY_S = 0.05
UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


def _unavailable(reason: str) -> bytes:
    body = json.dumps({"error": reason}).encode()
    return UNAVAILABLE % (len(body), body)


class _Upstream(asyncio.Protocol):
    """The connection to gunicorn behind one client connection: what gunicorn sends goes to
    the client unchanged."""

    def __init__(self, client: ClientConnection):
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.send(data)

    def eof_received(self) -> bool:
        self.client.upstream_ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.upstream_ended()

    def pause_writing(self) -> None:  # gunicorn reads slower than the client sends
        self.client.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()


class ClientConnection(asyncio.Protocol):
    """One client connection: its requests go to gunicorn whole, or as they come (see the
    module docstring), each under its deadline."""

    def __init__(self, intake: Intake):
        self.intake = intake
        self.loop = intake.loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()  # the client's bytes not passed on yet
        self.started: float | None = None  # the first byte of the request in `buffer`
        self.streaming = False  # a request is going on as it comes
        self.remaining: int | None = None  # of the streaming request; None: not counted
        self.cut = False  # no more is read from the client
        self.timer: asyncio.TimerHandle | None = None
        self.upstream: asyncio.Transport | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.pending: list[bytes] = []  # for gunicorn, while its connection opens
        self.end_upstream = False  # end the connection to gunicorn once `pending` is written
        self.reading_paused = False
        self.dropped: int | None = None  # bytes dropped once the connection is closing
        self.client_ended = False  # the client sends no more

    # --- the client's side ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.intake.connections.add(self)
        self._arm(self.intake.idle_timeout_s, self._idle)

    def data_received(self, data: bytes) -> None:
        if self.dropped is not None:
            self.dropped += len(data)
            if self.dropped > LINGER_BYTES and self.transport is not None:
                self.transport.close()
            return
        if self.cut:
            return
        if not self.buffer and not self.streaming:
            self._begin(self.loop.time())
        self.buffer += data
        self._advance()

    def eof_received(self) -> bool:
        """The client sends no more: what it sent goes on, and gunicorn then finds the end of
        the stream (a body cut short is a 400). The client still reads the answer."""
        self.client_ended = True
        if self.dropped is not None:
            return False  # closing, and the client has closed its side: closed now
        if self.cut:
            return True
        if self.buffer:
            self._pass_on_partial()
        self._finish()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.intake.connections.discard(self)
        self._cancel_timer()
        if self.connecting is not None:
            self.connecting.cancel()
        if self.upstream is not None:
            self.upstream.abort()

    def pause_writing(self) -> None:  # the client reads slower than gunicorn answers
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self.reading_paused and not self.cut:
            self.reading_paused = False
            self.transport.resume_reading()

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def upstream_ended(self) -> None:
        """gunicorn closed its side: it will answer nothing more on this connection."""
        self._close()

    def _close(self) -> None:
        """Close the connection once what is left to write has gone, lingering on what the
        client still sends (LINGER_S)."""
        if self.dropped is not None or self.transport is None or self.transport.is_closing():
            return
        self.cut, self.dropped = True, 0
        self.buffer.clear()
        if self.client_ended or not self.transport.can_write_eof():
            self.transport.close()  # after what is left to write
            return
        self.transport.write_eof()  # after what is left to write
        self.reading_paused = False
        self.transport.resume_reading()
        self._arm(LINGER_S, self.transport.close)

    # --- requests ---

    def _begin(self, at: float) -> None:
        """A request's first byte arrived `at`: its deadline runs from then."""
        self.started = at
        self._arm(self.intake.request_timeout_s, self._deadline, at)

    def _advance(self) -> None:
        """Pass on every request in `buffer` that may go on."""
        while True:
            if self.streaming:
                self._stream()
                if self.streaming:
                    return
            if not self.buffer:
                self._between_requests()
                return
            framing = self._frame()
            if framing.verdict is Verdict.WAIT:
                return
            assert self.started is not None
            if framing.verdict is Verdict.WHOLE:
                assert framing.size is not None
                request = bytes(self.buffer[: framing.size])
                del self.buffer[: framing.size]
                self._forward(stamped(request, framing.head_end, self.started))
                if self.buffer:  # the next request, pipelined: it began with this read
                    self._begin(self.loop.time())
                continue
            head = bytes(self.buffer)
            self.buffer.clear()
            self.streaming = True
            self.remaining = None if framing.size is None else framing.size - len(head)
            self._forward(stamped(head, framing.head_end, self.started))
            self._after_stream()

    def _frame(self) -> Framing:
        """The framing of the request in `buffer`; STREAM should looking at it fail, so that
        gunicorn reads it as it comes and answers what is wrong with it (under its deadline):
        a fault here costs that request its wait, never the intake."""
        try:
            return frame(bytes(self.buffer))
        except Exception:
            log.exception("the intake could not look at a request; it goes on as it comes")
            return Framing(Verdict.STREAM)

    def _stream(self) -> None:
        """Pass on what has come of the streaming request."""
        if self.remaining is None:
            data = bytes(self.buffer)
            self.buffer.clear()
        else:
            data = bytes(self.buffer[: self.remaining])
            del self.buffer[: self.remaining]
            self.remaining -= len(data)
        if data:
            self._forward(data)
        self._after_stream()

    def _after_stream(self) -> None:
        if self.remaining == 0:  # all of it is passed on: the next request is looked at
            self.streaming, self.remaining = False, None
            if self.buffer:
                self._begin(self.loop.time())
            else:
                self._between_requests()

    def _between_requests(self) -> None:
        """No request is arriving. Before the first, the connection is idle and closed after
        the keep-alive time; after it, gunicorn keeps its own connection alive as long, and
        closes it (and so this one) then."""
        self.started = None
        if self.connecting is None:
            self._arm(self.intake.idle_timeout_s, self._idle)
        else:
            self._cancel_timer()

    def _deadline(self) -> None:
        """The request's deadline: a head still arriving is dropped; a body still arriving,
        and a request still going on as it comes, are passed on as far as they came; the
        connection ends once gunicorn has answered."""
        if self.buffer and not self.streaming and self.buffer.find(b"\r\n\r\n") >= 0:
            self._pass_on_partial()
        self.cut = True
        self.buffer.clear()
        self._finish()

    def _idle(self) -> None:
        """Nothing has arrived for the keep-alive time: the connection is closed."""
        self._close()
        if self.upstream is not None:
            self.upstream.close()

    def _pass_on_partial(self) -> None:
        """Pass on what has arrived of a request cut short (by its client or its deadline)."""
        if self.streaming:
            self._forward(bytes(self.buffer))
        else:
            head_end = self._frame().head_end
            arrived = self.started or self.loop.time()
            self._forward(stamped(bytes(self.buffer), head_end, arrived))
        self.buffer.clear()

    def _finish(self) -> None:
        """No more goes to gunicorn: it answers what it has, then closes, and so does the
        client's connection; with nothing sent to gunicorn, it is closed now."""
        self._cancel_timer()
        self.pause_reading()
        if self.upstream is None and self.connecting is None:
            self._close()
            return
        self.end_upstream = True
        if self.upstream is not None and self.upstream.can_write_eof():
            self.upstream.write_eof()

    # --- gunicorn's side ---

    def _forward(self, data: bytes) -> None:
        if self.upstream is not None:
            self.upstream.write(data)
            return
        self.pending.append(data)
        if self.connecting is None:
            self.connecting = self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        """Open the connection to gunicorn. Its workers listen a moment after `serve` starts:
        until then, and up to the request's deadline, the intake tries again. Once `serve` is
        stopping, gunicorn takes no new connection and the client is answered 503 at once."""
        deadline = (self.started or self.loop.time()) + self.intake.request_timeout_s
        while True:
            try:
                transport, _ = await self.loop.create_connection(
                    lambda: _Upstream(self), "127.0.0.1", self.intake.upstream_port
                )
                break
            except OSError:
                if self.intake.stopping or self.loop.time() >= deadline:
                    self.send(_unavailable(UNREACHABLE))
                    self.upstream_ended()
                    return
                await asyncio.sleep(CONNECT_RETRY_S)
        assert isinstance(transport, asyncio.Transport)
        self.upstream = transport
        for data in self.pending:
            transport.write(data)
        self.pending.clear()
        if self.end_upstream and transport.can_write_eof():
            transport.write_eof()

    # --- timers ---

    def _arm(self, seconds: float, action: Callable[[], None], start: float | None = None) -> None:
        self._cancel_timer()
        self.timer = self.loop.call_at((start or self.loop.time()) + seconds, action)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Intake:
    """The intake's event loop: client connections on `listener`, gunicorn on the loopback's
    `upstream_port`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        upstream_port: int,
        request_timeout_s: float,
        idle_timeout_s: float,
    ):
        self.loop = loop
        self.upstream_port = upstream_port
        self.request_timeout_s = request_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.connections: set[ClientConnection] = set()
        self.stopping = False  # gunicorn takes no new connection

    async def serve(self, listener: socket.socket) -> asyncio.Server:
        """Start taking connections on `listener` (bound and listening)."""
        return await self.loop.create_server(
            lambda: ClientConnection(self), sock=listener, backlog=2048
        )

    def close_all(self) -> None:
        """Close every client connection (what is written goes out first)."""
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
