"""Leader and workers agree on the job over one TCP connection per worker.

This replaces the toolkit's fixed sleeps and `/tmp/done` files polled over ssh. The protocol,
one line per message:

    worker -> leader   HELLO <host>
    leader -> worker   KEY <the job's ssh public key>
    worker -> leader   READY <the worker sshd's host key>   |   FAIL <reason>
    leader -> worker   PING                                  (every second while the job runs)
    leader -> worker   EXIT <code> <reason as JSON>
    worker -> leader   BYE

So a worker exits within a second of the leader's mpirun ending, with its exit code; a worker
whose leader never answers gives up after `leader_timeout`, and one whose leader goes silent
(killed, crashed) gives up after `heartbeat_timeout`, naming the leader either way. The leader
learns which workers never became ready and names them.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Callable

from container.errors import PlatformError, TrainError

HEARTBEAT_INTERVAL = 1.0


def _send(connection: socket.socket, line: str) -> bool:
    try:
        connection.sendall(line.encode() + b"\n")
        return True
    except OSError:
        return False


class _Lines:
    """Line reader over a socket with a per-read timeout."""

    def __init__(self, connection: socket.socket):
        self.connection = connection
        self.buffer = b""

    def read(self, timeout: float) -> str | None:
        """The next line; None at end of stream; socket.timeout when silent too long."""
        self.connection.settimeout(timeout)
        while b"\n" not in self.buffer:
            chunk = self.connection.recv(4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode(errors="replace")


class Leader:
    """The leader's side: hands out the key, collects readiness, broadcasts the outcome."""

    def __init__(self, port: int, workers: list[str], public_key: str):
        self.workers = set(workers)
        self.public_key = public_key
        self.host_keys: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        self.connections: dict[str, socket.socket] = {}
        self.said_bye: set[str] = set()
        self.condition = threading.Condition()
        self.finished = threading.Event()
        try:
            self.server = socket.create_server(("", port))
        except OSError as error:
            raise PlatformError(f"the leader cannot listen on coordinator port {port}: "
                                f"{error.strerror}; choose another coordinator_port") from None
        threading.Thread(target=self._accept, daemon=True, name="coordinator").start()

    def _accept(self) -> None:
        while not self.finished.is_set():
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        lines = _Lines(connection)
        try:
            hello = lines.read(timeout=30) or ""
            host = hello.partition(" ")[2].strip()
            if not hello.startswith("HELLO ") or host not in self.workers:
                _send(connection, f"EXIT 1 {json.dumps(f'{host!r} is not a worker of this job')}")
                connection.close()
                return
            _send(connection, f"KEY {self.public_key}")
            answer = lines.read(timeout=120) or "FAIL the worker closed the connection"
        except OSError:
            connection.close()
            return
        verb, _, rest = answer.partition(" ")
        with self.condition:
            if verb == "READY":
                self.host_keys[host] = rest
                self.connections[host] = connection
            else:
                self.failures[host] = rest
            self.condition.notify_all()
        if verb == "READY":
            self._await_bye(host, lines)

    def _await_bye(self, host: str, lines: _Lines) -> None:
        while True:
            try:
                line = lines.read(timeout=3600)
            except OSError:
                return
            if line is None or line == "BYE":
                with self.condition:
                    self.said_bye.add(host)
                    self.condition.notify_all()
                return

    def wait_ready(self, timeout: float) -> dict[str, str]:
        """Block until every worker is ready; returns host -> sshd host key."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while True:
                if self.failures:
                    host, reason = next(iter(self.failures.items()))
                    raise PlatformError(f"worker {host} could not get ready: {reason}")
                missing = sorted(self.workers - set(self.host_keys))
                if not missing:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PlatformError(
                        f"these workers never reported ready within {timeout:g} s: "
                        f"{', '.join(missing)} (is the container running there, and can it "
                        f"reach this leader?)")
                self.condition.wait(left)
        threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat").start()
        return dict(self.host_keys)

    def _heartbeat(self) -> None:
        while not self.finished.wait(HEARTBEAT_INTERVAL):
            with self.condition:
                connections = list(self.connections.values())
            for connection in connections:
                _send(connection, "PING")

    def finish(self, code: int, reason: str, timeout: float = 5.0) -> None:
        """Tell every connected worker the outcome and wait (briefly) until they have it."""
        self.finished.set()
        with self.condition:
            connections = dict(self.connections)
        for connection in connections.values():
            _send(connection, f"EXIT {code} {json.dumps(reason)}")
        deadline = time.monotonic() + timeout
        with self.condition:
            while not set(connections) <= self.said_bye and time.monotonic() < deadline:
                self.condition.wait(deadline - time.monotonic())
        for connection in connections.values():
            connection.close()
        self.server.close()


def follow_leader(leader: str, port: int, host: str, *, leader_timeout: float,
                  heartbeat_timeout: float,
                  on_key: Callable[[str], str]) -> tuple[int, str]:
    """The worker's side: returns the job's (exit code, reason) as the leader reports it.

    `on_key(public_key)` prepares this host (starts its sshd) and returns the host key.
    """
    connection = _connect(leader, port, leader_timeout)
    lines = _Lines(connection)
    try:
        _send(connection, f"HELLO {host}")
        line = _expect(lines, leader, heartbeat_timeout)
        if line.startswith("EXIT "):
            return _outcome(line)
        try:
            host_key = on_key(line.partition(" ")[2])
        except TrainError as error:
            _send(connection, f"FAIL {error}")
            raise
        _send(connection, f"READY {host_key}")
        while True:
            line = _expect(lines, leader, heartbeat_timeout)
            if line.startswith("EXIT "):
                _send(connection, "BYE")
                return _outcome(line)
    finally:
        connection.close()


def _connect(leader: str, port: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return socket.create_connection((leader, port), timeout=5)
        except OSError as error:
            if time.monotonic() + delay >= deadline:
                raise PlatformError(
                    f"the leader {leader} never answered on port {port} within {timeout:g} s "
                    f"({error.strerror or error}); is the leader host up and running this "
                    f"image?") from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _expect(lines: _Lines, leader: str, timeout: float) -> str:
    try:
        line = lines.read(timeout)
    except socket.timeout:
        raise PlatformError(f"lost contact with the leader {leader}: silent for "
                            f"{timeout:g} s") from None
    except OSError as error:
        raise PlatformError(f"lost contact with the leader {leader}: {error}") from None
    if line is None:
        raise PlatformError(f"lost contact with the leader {leader}: it closed the "
                            f"connection before reporting the job's outcome")
    return line


def _outcome(line: str) -> tuple[int, str]:
    _, code, reason = line.split(" ", 2)
    return int(code), json.loads(reason)
