"""A request reaches a request thread only once it has all arrived, and never waits past its
deadline, SAGEMAKER_MODEL_SERVER_TIMEOUT after its first byte.

Why: gunicorn's threaded worker hands each connection to a request thread as soon as it is
readable, and the thread then reads the request with blocking reads that have no deadline: a
client that stopped in the middle of its headers held a thread until it hung up, one that
stopped in its body held it until a socket timeout, one that sent a byte a second held it until
its body was in. Enough such clients (one per thread) left no thread for `/ping`, and
SageMaker replaces an instance whose pings go unanswered. gunicorn has no setting for this, and
its only hook before a request (`pre_request`) runs once the headers are read. A socket
timeout bounds one read, not a request (a byte a second never trips it), and still keeps the
thread while the client stalls. So the worker's thread pool, the one part of the threaded
worker gunicorn lets a subclass replace (`ThreadWorker.get_thread_pool`, see serve.server),
looks at each connection before it gives it a thread:

- The whole request (its headers and the body they declare, by Content-Length or chunked) has
  arrived, in the kernel's receive buffer (and in what gunicorn read ahead with the connection's
  last request): a thread takes it at once. Finding out is one peek at the buffer (MSG_PEEK,
  nothing is consumed) and a scan of the headers: 7 to 15 microseconds on a busy 2-core
  machine, about 1 % of the CPU time of the digits MLP's one-row request (1.1 to 1.5 ms).
- Part of it is still to come: the connection waits, on no thread, in one epoll watcher thread
  per worker, and is looked at again whenever bytes arrive. It gets a thread once the request
  is whole, or at its deadline. Then the socket's reading side is shut first (shutdown(SHUT_RD):
  a read returns what had arrived, then the end of the stream), so its thread finds the request
  cut short at once: gunicorn drops a connection whose headers end early (no answer), and the
  app answers 408 to a body that does (serve.app).
- It cannot wait to be whole: PEEK_BYTES have already arrived (a large body at full speed,
  which the kernel's buffer could not hold whole), the client waits for gunicorn's
  `100 Continue` before it sends its body, or the headers are ones gunicorn refuses at once.
  A thread takes it at once, and if the thread is still serving it at its deadline, the
  socket's reading side is shut then, which ends any read in progress.

A connection that has sent nothing yet is idle, not a request: it waits up to gunicorn's
keep-alive time for its first byte (as gunicorn's own idle connections do), then is closed
the same way. The deadline the app keeps (serve.app) counts from the same first byte: the
intake records when it arrived for every request that waited (`arrived`).

The pool reads two of the threaded worker's names that gunicorn does not document: the
connection it is given to run (`submit(handle, conn)`, `conn.sock`) and the bytes gunicorn has
read ahead from it (`conn.parser.unreader.buf`, which gthread's own `finish_request` checks
the same way). A call it does not recognise runs as in the stock pool. The tests of slow
clients and of pipelined requests on a real server (tests/serve/test_serve_slow_clients.py)
fail if either name changes.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import re
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ParamSpec, TypeVar

# How much of a receive buffer is looked at. Every Linux default buffer holds more (the
# default tcp_rmem of 87 to 128 KB keeps at least half of it for data), so a client sending at
# full speed always fills it: a request larger than this is read by its thread as it comes.
PEEK_BYTES = 16 * 1024
_WATCHED = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
_ENDED = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR  # the client sends no more
_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]+")
_FIRST_COMPACTION = 1024  # deadline entries before the first clean-up of spent ones
# A Content-Length of more digits is larger than any body a client sends (10^18 bytes), so
# waiting for it is pointless, and int() refuses a string of more than 4300 digits
# (sys.get_int_max_str_digits): such a request goes to a thread at once, where gunicorn answers
# 400 to a length it cannot read and the app 413 to one over the payload limit.
MAX_LENGTH_DIGITS = 18

log = logging.getLogger(__name__)

_P = ParamSpec("_P")  # ThreadPoolExecutor.submit's, which IntakePool.submit overrides
_T = TypeVar("_T")


class Verdict(Enum):
    """What the start of a connection's receive buffer says about its request."""

    WAIT = "part of the request is still to come"
    WHOLE = "the whole request has arrived (or the stream has ended): no read will wait"
    STREAM = "a thread must read the request as it comes"


def verdict(data: bytes) -> Verdict:
    """The verdict on `data`, the start of a receive buffer (at most PEEK_BYTES); b"" is the
    end of the stream. Anything unusual is STREAM, never WHOLE: a thread given a request that
    is not whole would wait for the rest with no deadline."""
    if len(data) >= PEEK_BYTES or data.startswith(b"\r\n"):
        return Verdict.STREAM
    end = data.find(b"\r\n\r\n")
    head = data if end < 0 else data[: end + 2]  # each header line then ends with CRLF
    if head.count(b"\n") != head.count(b"\r\n"):
        return Verdict.STREAM  # a bare LF: gunicorn refuses the head at once
    if end < 0:
        return Verdict.WAIT if data else Verdict.WHOLE
    head, body = head.lower(), data[end + 4 :]
    if b"\r\nexpect:" in head:  # the client waits for 100 Continue before sending its body
        return Verdict.STREAM
    lengths = _values(head, b"content-length")
    if b"\r\ntransfer-encoding:" in head:
        chunked = _values(head, b"transfer-encoding") == [b"chunked"] and not lengths
        return chunked_verdict(body) if chunked else Verdict.STREAM
    if not lengths:
        return Verdict.WHOLE
    if len(lengths) > 1 or not lengths[0].isdigit() or len(lengths[0]) > MAX_LENGTH_DIGITS:
        return Verdict.STREAM
    return Verdict.WHOLE if len(body) >= int(lengths[0]) else Verdict.WAIT


def chunked_verdict(body: bytes) -> Verdict:
    """WHOLE once `body` holds a chunked body's last chunk and the empty line after its
    trailers, STREAM when its framing is malformed (gunicorn answers that at once)."""
    position = 0
    while (line_end := body.find(b"\r\n", position)) >= 0:
        size = body[position:line_end].partition(b";")[0].strip(b" \t")
        if not _CHUNK_SIZE.fullmatch(size):
            return Verdict.STREAM
        if int(size, 16) == 0:
            return Verdict.WHOLE if body.find(b"\r\n\r\n", line_end) >= 0 else Verdict.WAIT
        position = line_end + 2 + int(size, 16) + 2
        if position > len(body):
            return Verdict.WAIT
        if body[position - 2 : position] != b"\r\n":
            return Verdict.STREAM
    return Verdict.WAIT


def _values(head: bytes, name: bytes) -> list[bytes]:
    """The values of header `name` in `head` (lower-cased, every header line ending in CRLF)."""
    key, values = b"\r\n" + name + b":", []
    start = head.find(key)
    while start >= 0:
        line_end = head.find(b"\r\n", start + len(key))
        values.append(head[start + len(key) : line_end].strip(b" \t"))
        start = head.find(key, line_end)
    return values


def peek(sock: socket.socket) -> bytes | None:
    """The start of the socket's receive buffer, left in it; b"" at the end of the stream (or a
    failed connection: its thread finds out), None while nothing has arrived."""
    try:
        return sock.recv(PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None
    except OSError:
        return b""


# When the first byte of each request that waited in the intake arrived, for the app's deadline.
_arrivals: weakref.WeakKeyDictionary[socket.socket, float] = weakref.WeakKeyDictionary()


def arrived(environ: dict[str, Any]) -> float:
    """When the request in `environ` began (time.monotonic()): its first byte's arrival if it
    waited in the intake, else now, as its thread took it whole."""
    sock = environ.get("gunicorn.socket")
    if _arrivals and sock is not None:
        return _arrivals.pop(sock, None) or time.monotonic()
    return time.monotonic()


def received(conn: Any) -> bytes | None:
    """What has arrived of the next request on gthread's connection `conn`: the bytes gunicorn
    read ahead with the last request (which gthread's finish_request checks the same way),
    then the start of the receive buffer; b"" at the end of the stream, None while nothing has
    arrived."""
    read_ahead = conn.parser.unreader.buf.getvalue() if conn.parser is not None else b""
    data = peek(conn.sock)
    if data is None:
        return read_ahead or None
    return read_ahead + data


def _shut_reading(sock: socket.socket) -> None:
    """Make every read of `sock`, one in progress included, return what has arrived and then
    the end of the stream."""
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError:  # the client has gone, or gunicorn has closed the socket
        pass


@dataclass(eq=False)
class _Request:
    """A connection's next request, from the intake's side."""

    run: Callable[[Any], Any]  # what gthread asked the pool to run for the connection
    conn: Any  # gthread's connection
    deadline: float
    arrived: float | None  # its first byte; None while the connection is idle
    future: Future[Any] = field(default_factory=Future)
    waiting: bool = False  # in the watcher, on no thread
    fd: int = -1  # its file descriptor while it waits (the socket may be closed by then)
    cut_at_deadline: bool = False  # on a thread, its reading side to be shut at the deadline

    @property
    def sock(self) -> socket.socket:
        sock: socket.socket = self.conn.sock  # IntakePool.submit took only such connections
        return sock

    def pending(self) -> bool:
        """Whether its deadline still has something to do."""
        return self.waiting or (self.cut_at_deadline and not self.future.done())


class IntakePool(ThreadPoolExecutor):
    """The threaded worker's pool of `threads` request threads, behind the intake."""

    def __init__(self, threads: int, request_timeout_s: float, idle_timeout_s: float):
        super().__init__(max_workers=threads)
        self._request_timeout_s = request_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._waiting: dict[int, _Request] = {}  # by file descriptor
        self._deadlines: list[tuple[float, int, _Request]] = []  # a heap, stale entries kept
        self._order = itertools.count()
        self._epoll = select.epoll()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK)
        self._epoll.register(self._wake, select.EPOLLIN)
        self._watcher: threading.Thread | None = None
        self._sleeping_until = math.inf
        self._compact_at = _FIRST_COMPACTION
        self._stopping = False

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """Run `fn` (gthread's handle(conn)) on a thread once the connection's request is
        whole or cut short at its deadline."""
        conn = args[0] if len(args) == 1 and not kwargs else None
        if not isinstance(getattr(conn, "sock", None), socket.socket):
            return super().submit(fn, *args, **kwargs)
        data, found = _look(conn)
        now = time.monotonic()
        if found is Verdict.WHOLE:
            return super().submit(fn, *args, **kwargs)  # fn(conn): there are no others
        if data is None:
            request = _Request(fn, conn, now + self._idle_timeout_s, None)
        else:
            request = _Request(fn, conn, now + self._request_timeout_s, now)
        if found is Verdict.STREAM:
            self._hand_over(request, cut_at_deadline=True)
        else:
            self._wait(request)
        return request.future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stopping = True
        os.eventfd_write(self._wake, 1)
        super().shutdown(wait, cancel_futures=cancel_futures)

    def _wait(self, request: _Request) -> None:
        request.waiting, request.fd = True, request.sock.fileno()
        with self._lock:
            self._waiting[request.fd] = request
            self._add_deadline(request)
        self._epoll.register(request.fd, _WATCHED)

    def _add_deadline(self, request: _Request) -> None:
        """Under the lock: the watcher (started on the first deadline, from the worker's main
        thread, so that it runs on its core) wakes in time for `request`'s deadline. Entries
        whose deadline has nothing left to do are dropped whenever the heap has doubled."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="intake", daemon=True)
            self._watcher.start()
        if len(self._deadlines) >= self._compact_at:
            self._deadlines = [entry for entry in self._deadlines if entry[2].pending()]
            heapq.heapify(self._deadlines)
            self._compact_at = max(_FIRST_COMPACTION, 2 * len(self._deadlines))
        heapq.heappush(self._deadlines, (request.deadline, next(self._order), request))
        if request.deadline < self._sleeping_until:
            os.eventfd_write(self._wake, 1)

    def _hand_over(self, request: _Request, cut_at_deadline: bool) -> None:
        """Give the connection its thread; with `cut_at_deadline`, shut its reading side at
        the deadline if its thread is still serving it then."""
        if request.arrived is not None:
            _arrivals[request.sock] = request.arrived
        request.cut_at_deadline = cut_at_deadline
        if cut_at_deadline and not request.waiting:  # a waiting one has its deadline already
            with self._lock:
                self._add_deadline(request)
        request.waiting = False
        super().submit(_settle, request.future, request.run, request.conn)

    def _watch(self) -> None:
        """The watcher thread: a waiting request is looked at whenever bytes arrive for it, and
        given a thread once whole or at its deadline; a streamed one is cut at its deadline."""
        while not self._stopping:
            with self._lock:
                self._sleeping_until = self._deadlines[0][0] if self._deadlines else math.inf
            timeout = self._sleeping_until - time.monotonic()
            events = self._epoll.poll(None if timeout == math.inf else max(timeout, 0.0))
            now = time.monotonic()
            for fd, mask in events:
                if fd == self._wake:
                    os.eventfd_read(self._wake)
                elif (request := self._waiting.get(fd)) is not None:
                    self._safely(request, self._look_again, request, now, ended=bool(mask & _ENDED))
            self._expire(now)

    def _safely(
        self, request: _Request, action: Callable[..., None], *args: Any, **kwargs: Any
    ) -> None:
        """Run the watcher's `action` on one connection. Whatever it raises is logged and
        costs that connection its wait, never the watcher: every waiting request needs the
        watcher for its deadline, and without it a request that arrived in pieces would wait
        for ever while `/ping` still answered. A connection still waiting then goes to a
        thread, which reads it as it comes, cut at its deadline."""
        try:
            action(*args, **kwargs)
        except Exception:
            log.exception("the intake failed on a connection; a thread reads it as it comes")
            if not request.waiting:
                return
            try:
                self._stop_waiting(request)
                self._hand_over(request, cut_at_deadline=True)
            except Exception as error:  # gthread closes a connection whose future failed
                log.exception("the intake could not give the connection a thread; it is closed")
                request.waiting = False
                _shut_reading(request.sock)
                if not request.future.done():
                    request.future.set_exception(error)

    def _look_again(self, request: _Request, now: float, ended: bool) -> None:
        """Bytes have arrived for `request`, or with `ended` the client will send no more."""
        data, found = _look(request.conn)
        if data is None:
            return
        if request.arrived is None:  # an idle connection's first byte: its request begins
            request.arrived, request.deadline = now, now + self._request_timeout_s
            with self._lock:
                self._add_deadline(request)
        if ended:
            found = Verdict.WHOLE  # no read waits
        if found is not Verdict.WAIT:
            self._stop_waiting(request)
            self._hand_over(request, cut_at_deadline=found is Verdict.STREAM)

    def _expire(self, now: float) -> None:
        while True:
            with self._lock:
                if not self._deadlines or self._deadlines[0][0] > now:
                    return
                deadline, _, request = heapq.heappop(self._deadlines)
            if deadline != request.deadline or not request.pending():
                continue  # superseded, or nothing left to cut
            self._safely(request, self._cut, request)

    def _cut(self, request: _Request) -> None:
        """`request`'s deadline has come: shut its reading side, and if it is still waiting,
        give it a thread, which finds it cut short."""
        _shut_reading(request.sock)
        if request.waiting:
            self._stop_waiting(request)
            self._hand_over(request, cut_at_deadline=False)

    def _stop_waiting(self, request: _Request) -> None:
        with self._lock:
            self._waiting.pop(request.fd, None)
        try:
            self._epoll.unregister(request.fd)
        except OSError:  # closed already: the kernel dropped it from the epoll set
            pass


def _look(conn: Any) -> tuple[bytes | None, Verdict]:
    """What has arrived of the next request on `conn` (see `received`) and the verdict on it.
    Should looking fail, STREAM: its thread reads the request as it comes, and gunicorn or the
    app answer what is wrong with it; a fault here must never end the worker's main thread,
    which calls this for every new connection, nor the watcher."""
    try:
        data = received(conn)
        return data, Verdict.WAIT if data is None else verdict(data[:PEEK_BYTES])
    except Exception:
        log.exception("the intake could not look at a request; a thread reads it as it comes")
        return b"", Verdict.STREAM


def _settle(future: Future[Any], run: Callable[[Any], Any], conn: Any) -> None:
    """Run `run(conn)` on a request thread and settle `future`, the one gthread waits on, with
    its outcome."""
    try:
        future.set_result(run(conn))
    except BaseException as error:
        future.set_exception(error)
