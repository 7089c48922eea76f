"""A stand-in MLflow tracking server for the tests of what goes wrong (not a test module): a real
HTTP server on a free loopback port whose answers the test chooses, path by path, down to the
bytes on the wire (a malformed 200, a trickle, a connection closed mid-answer, a redirect), and
which records every request it gets; `servers` is the fixture that starts them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

Answer = Callable[[BaseHTTPRequestHandler], None]


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def reply(
    status: int = 200,
    body: object = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> Answer:
    """An answer: `body` as JSON (or `raw` bytes as they are) with this status."""
    data = raw if raw is not None else json.dumps({} if body is None else body).encode()

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return answer


def hang_up(handler: BaseHTTPRequestHandler) -> None:
    """No answer at all: the connection is closed."""
    handler.close_connection = True


def cut_short(handler: BaseHTTPRequestHandler) -> None:
    """A 200 that promises 100 bytes and sends 10."""
    handler.wfile.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"run": {}')
    handler.close_connection = True


def trickle(seconds_per_byte: float, body: bytes = b'{"a": 12345}') -> Answer:
    """A 200 whose body comes one byte at a time: each read gets a byte well within any
    per-read timeout, the whole takes len(body) * seconds_per_byte."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.flush()
        for byte in body:
            time.sleep(seconds_per_byte)
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()

    return answer


class StubServer:
    """`routes` maps the end of a path (`runs/create`) to its answer; `default` answers the
    rest. `requests` lists what came, in order."""

    def __init__(self, routes: dict[str, Answer] | None = None, default: Answer = reply()):
        self.routes, self.default = dict(routes or {}), default
        self.requests: list[Seen] = []
        self.released = threading.Event()  # set at close: slow answers stop waiting
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                self.seen = Seen(self.command, self.path, dict(self.headers), body)
                stub.requests.append(self.seen)
                route = self.path.split("?")[0].split("/api/2.0/mlflow/")[-1]
                try:
                    stub.routes.get(route, stub.default)(self)
                except OSError:  # the client gave up first: what some tests want
                    self.close_connection = True

            do_GET = do_POST = _any

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def slow(self, seconds: float, then: Answer = reply()) -> Answer:
        """An answer that comes after `seconds` (or when the server closes)."""

        def answer(handler: BaseHTTPRequestHandler) -> None:
            self.released.wait(seconds)
            then(handler)

        return answer

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers():
    """servers(routes, default) -> a started StubServer; all are closed after the test."""
    made: list[StubServer] = []

    def make(routes: dict[str, Answer] | None = None, default: Answer = reply()) -> StubServer:
        made.append(StubServer(routes, default))
        return made[-1]

    yield make
    for server in made:
        server.close()
