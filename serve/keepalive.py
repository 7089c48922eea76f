"""gunicorn's threaded worker, with a kept-alive connection served by the same thread.

gunicorn's `gthread` worker hands every request twice between threads: its event loop sees the
connection readable and gives it to a request thread, which answers one request and gives the
connection back to the loop to wait for the next. Each hand-off wakes a thread and takes the
interpreter lock, about 0.1 ms per request in all, as much as the whole model call of a small
model. A client of an inference endpoint usually sends its next request as soon as it has the
answer, so here the request thread first waits a moment (`LINGER_S`) for it on the same
connection and answers it at once; only a connection that stays quiet goes back to the loop,
where idle connections cost no thread. Everything else (accepting, timeouts, graceful
shutdown, slow clients) is gunicorn's own.
"""

from __future__ import annotations

import select

from gunicorn.workers.gthread import ThreadWorker

# Long enough for a client's next request on a connection it keeps busy (a round trip on the
# network plus its own work), short enough that a quiet connection hardly holds a thread.
LINGER_S = 0.005


def _readable(sock, timeout_s: float) -> bool:
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(timeout_s * 1000))


class KeepAliveWorker(ThreadWorker):
    """`gthread`, where a request thread keeps a busy kept-alive connection."""

    def handle(self, conn):
        keep_alive = super().handle(conn)
        while keep_alive is True and self._may_linger() and (
                conn.parser.unreader.buf.getvalue() or _readable(conn.sock, LINGER_S)):
            keep_alive = super().handle(conn)
        return keep_alive

    def _may_linger(self) -> bool:
        """Only while every open connection can have a thread: with more connections than
        threads, a busy connection kept by its thread would starve those waiting for one."""
        return self.alive and self.nr_conns <= self.cfg.threads
