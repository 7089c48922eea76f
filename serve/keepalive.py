"""gunicorn's threaded worker, with a kept-alive connection served by the same thread.

gunicorn's `gthread` worker hands every request twice between threads: its event loop sees the
connection readable and gives it to a request thread, which answers one request and gives the
connection back to the loop to wait for the next. Each hand-off wakes a thread and takes the
interpreter lock, about 0.1 ms per request in all, as much as the whole model call of a small
model. A client of an inference endpoint usually sends its next request as soon as it has the
answer, so here the request thread first waits a moment (`LINGER_S`) for it on the same
connection and answers it at once; only a connection that stays quiet goes back to the loop,
where idle connections cost no thread.

A kept-alive connection also stays with the worker that accepted it, and gunicorn lets every
worker race for each new one: 64 clients connecting at once were split 45/19 or 53/11 between
two workers here, and the busier worker then set the tail for as long as they stayed. So the
workers publish how many connections each holds (`ConnectionCounts`), and one holding more
than the least busy other leaves it the new connection: it stops listening until it is no
longer the busier or `DEFER_S` has passed, and then takes the next one whatever the counts, so
a connection waits at most that long even when no other worker can take it.
Each request is handled in its turn (serve.turns), and a connection's socket gives the turn
away while it waits for its client (`_SocketOutOfTurn`). Everything else (timeouts, graceful
shutdown) is gunicorn's own.
"""

from __future__ import annotations

import mmap
import select
import socket
import time
from typing import Any

from gunicorn.workers.gthread import _DEFER, DEFAULT_WORKER_DATA_TIMEOUT, ThreadWorker

from serve.host import lowest_free
from serve.turns import TURNS

# Long enough for a client's next request on a connection it keeps busy (a round trip on the
# network plus its own work), short enough that a quiet connection hardly holds a thread.
LINGER_S = 0.005
# The longest a busier worker leaves new connections to the others: longer than a worker's
# loop takes to reach one (it shares the interpreter lock with its request threads, whose
# switch interval is 5 ms), short enough that a connection nobody else takes hardly waits.
DEFER_S = 0.01
# How often a deferring worker looks whether it is still the busier.
RECHECK_S = 0.001


class ConnectionCounts:
    """How many connections each worker holds, in memory shared by all of them.

    Made in the gunicorn master, which imports this module to load the worker class, and
    inherited by every worker it forks. The master gives each worker a slot before forking it
    (`assign`) and frees the slot when the worker exits (`free`); a worker that is shutting
    down frees its own, so every count is that of a live worker taking connections.
    """

    SLOTS = 64  # serve.config allows at most 64 workers
    FREE = -1

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, self.SLOTS * 8)  # shared and anonymous
        self._slots = memoryview(self._memory).cast("q")
        for slot in range(self.SLOTS):
            self._slots[slot] = self.FREE

    def assign(self, server: Any, worker: Any) -> None:
        """gunicorn's `pre_fork` hook: the lowest slot no live worker holds."""
        worker.slot = lowest_free([w.slot for w in server.WORKERS.values()], self.SLOTS)
        self._slots[worker.slot] = 0

    def free(self, server: Any, worker: Any) -> None:
        """gunicorn's `child_exit` hook."""
        self._slots[worker.slot] = self.FREE

    def publish(self, slot: int, count: int) -> None:
        self._slots[slot] = count

    def least_but(self, slot: int) -> int | None:
        """The fewest connections another worker holds; None when there is no other."""
        counts = self._slots.tolist()
        counts[slot] = self.FREE
        return min((count for count in counts if count != self.FREE), default=None)


COUNTS = ConnectionCounts()


def _readable(sock, timeout_s: float) -> bool:
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(timeout_s * 1000))


class _SocketOutOfTurn:
    """A connection's socket, whose reads and writes that would wait for the client let the
    worker's next request take its turn meanwhile: a client that sends slowly, or reads its
    answer slowly, holds back only its own request."""

    def __init__(self, sock: socket.socket):
        self._sock = sock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def recv(self, size: int) -> bytes:
        if _readable(self._sock, 0):
            return self._sock.recv(size)
        with TURNS.paused():
            return self._sock.recv(size)

    def sendall(self, data: bytes) -> None:
        try:
            sent = self._sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            with TURNS.paused():
                self._sock.sendall(memoryview(data)[sent:])


class KeepAliveWorker(ThreadWorker):
    """`gthread`, where a request thread keeps a busy kept-alive connection, and a worker
    holding more connections than another leaves it the new ones."""

    slot = 0  # set by ConnectionCounts.assign in the master

    def enqueue_req(self, conn):
        if not isinstance(conn.sock, _SocketOutOfTurn):
            conn.sock = _SocketOutOfTurn(conn.sock)
        super().enqueue_req(conn)

    def handle(self, conn):
        """Each request in its turn (serve.turns); waiting for the client is out of turn."""
        if not conn.initialized and not conn.data_ready:  # a new connection
            if not conn.wait_for_data(DEFAULT_WORKER_DATA_TIMEOUT):
                return _DEFER  # gunicorn's loop waits for its first bytes
        with TURNS.turn():
            keep_alive = super().handle(conn)
        while keep_alive is True and self._may_linger() and (
                conn.parser.unreader.buf.getvalue() or _readable(conn.sock, LINGER_S)):
            with TURNS.turn():
                keep_alive = super().handle(conn)
        return keep_alive

    def _may_linger(self) -> bool:
        """Only while every open connection can have a thread: with more connections than
        threads, a busy connection kept by its thread would starve those waiting for one."""
        return self.alive and self.nr_conns <= self.cfg.threads

    def init_process(self):
        self._listen_again_at = 0.0  # while deferring: when to listen again at the latest
        self._deferred = False  # the next connection is taken whatever the counts
        super().init_process()

    def _busier(self) -> bool:
        least = COUNTS.least_but(self.slot)
        return least is not None and self.nr_conns > least + 1

    def wait_for_and_dispatch_events(self, timeout):
        """Only this loop changes `nr_conns`, so publishing it before each wait keeps the
        shared count true whenever another worker may read it. A deferring worker looks again
        every `RECHECK_S` and listens again as soon as it is no longer the busier: when all
        are deferring, the least busy listens again first."""
        if time.monotonic() < self._listen_again_at:
            if self._busier():
                timeout = min(timeout, RECHECK_S)
            else:
                self._listen_again_at = 0.0
                super().set_accept_enabled(True)
        COUNTS.publish(self.slot, self.nr_conns if self.alive else COUNTS.FREE)
        super().wait_for_and_dispatch_events(timeout)

    def set_accept_enabled(self, enabled):
        """gunicorn's loop turns listening back on at once; a deferring worker waits."""
        if not (enabled and time.monotonic() < self._listen_again_at):
            super().set_accept_enabled(enabled)

    def accept(self, listener):
        """Every worker is woken for a new connection and the first to accept gets it (the
        others' accept finds none, which gunicorn ignores). A busier worker stops listening
        instead, while its loop goes on serving its own connections; the next connection it
        is woken for, it takes."""
        if not self._deferred and self._busier():
            self._deferred = True
            self._listen_again_at = time.monotonic() + DEFER_S
            super().set_accept_enabled(False)
            return
        self._deferred = False
        super().accept(listener)
        COUNTS.publish(self.slot, self.nr_conns)
