"""Leader and workers agree on the job over one TCP connection per worker.

This replaces the toolkit's fixed sleeps and `/tmp/done` files polled over ssh. The protocol,
one line per message:

    worker -> leader   HELLO <host>
    leader -> worker   KEY <the job's ssh public key>
    worker -> leader   READY <the worker sshd's host key>   |   FAIL <reason>
    both ways          PING                                  (every second, from HELLO on)
    data host -> leader ENDED <code> <kind> <reason as JSON> (its script failed)
    leader -> worker   EXIT <code> <kind> <reason as JSON>
    worker -> leader   BYE

A data host (a heterogeneous job's host that runs no rank, container.data_host) takes part as a
worker does, with `-` for a host key (it runs no sshd). Its script runs beside the training:
when the script fails, or the host falls silent, the leader stops the training (`abort`) and
the job fails with the data host's reason.

Hosts start in any order: a worker retries until `leader_timeout`, the leader waits
`host_timeout` for every worker. Both sides send PING every second from the first contact, so
neither waits on a silent peer: a worker whose leader goes silent (killed, crashed) gives up
after `heartbeat_timeout` naming the leader, and a worker that goes silent before the job
starts fails the job naming that worker. A worker exits within a second of the leader's
mpirun ending, with the leader's exit code and the root cause.

Only the cluster is heard. The coordinator listens on the leader's cluster address and
accepts `HELLO <host>` only from the address `<host>` resolves to, only once per host and
only before the job runs; anyone else is logged and disconnected before seeing the key. Input
is bounded: lines of at most MAX_LINE bytes, HELLO within HELLO_TIMEOUT of connecting and
READY within HANDSHAKE_TIMEOUT, at most MAX_PENDING connections that have not said who they
are. Each connection has its own threads and a send timeout, so one slow or dead peer never
delays another's heartbeats.
"""

from __future__ import annotations

import errno
import json
import select
import socket
import threading
import time
from collections.abc import Callable

from container.failure import Outcome
from container.network import address_of
from job.errors import PlatformError, TrainError
from job.protocol import FailureKind

HEARTBEAT_INTERVAL = 1.0
MAX_LINE = 64 * 1024
HELLO_TIMEOUT = 10.0
HANDSHAKE_TIMEOUT = 120.0
SEND_TIMEOUT = 10.0
MAX_PENDING = 32


def log(message: str) -> None:
    print(f"launcher: {message}", flush=True)


class ProtocolError(Exception):
    """A peer broke the protocol (a line too long, a handshake too slow)."""


class _Connection:
    """One peer: lines in with deadlines, lines out under a lock, PING every second."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sock.settimeout(SEND_TIMEOUT)  # bounds sendall; reads wait with select
        self.buffer = b""
        self.lock = threading.Lock()
        self.closed = threading.Event()

    def send(self, line: str) -> bool:
        with self.lock:
            if self.closed.is_set():
                return False
            try:
                self.sock.sendall(line.encode() + b"\n")
                return True
            except OSError:
                self._close()
                return False

    def read(self, deadline: float) -> str | None:
        """The next line; None at end of stream; socket.timeout at the deadline."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE:
                raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("deadline passed")
            readable, _, _ = select.select([self.sock], [], [], left)
            if readable:
                chunk = self.sock.recv(MAX_LINE)
                if not chunk:
                    return None
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        if len(line) > MAX_LINE:
            raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
        return line.decode(errors="replace")

    def ping_until_closed(self) -> None:
        threading.Thread(target=self._ping, daemon=True, name="heartbeat").start()

    def _ping(self) -> None:
        while not self.closed.wait(HEARTBEAT_INTERVAL):
            self.send("PING")

    def close(self) -> None:
        with self.lock:
            self._close()

    def _close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()


def _exit_line(outcome: Outcome, verb: str = "EXIT") -> str:
    kind = outcome.kind.value if outcome.kind else "ok"
    return f"{verb} {outcome.exit_code} {kind} {json.dumps(outcome.reason)}"


def ended_line(outcome: Outcome) -> str:
    """What a data host sends the leader when its script failed."""
    return _exit_line(outcome, "ENDED")


def _outcome(line: str) -> Outcome:
    """The Outcome of an EXIT or ENDED line; ValueError unless it is one the launcher can end
    a job with: a text reason, an exit code a process can have, a kind exactly when the code
    is not 0 (the peer is dropped then, not the coordinator)."""
    _, code, kind, reason = line.split(" ", 3)
    try:
        text = json.loads(reason)
    except RecursionError:  # valid JSON nested past the parser's depth
        raise ValueError("an outcome nested too deeply") from None
    outcome = Outcome(None if kind == "ok" else FailureKind(kind), text, int(code))
    if (
        not isinstance(text, str)
        or not 0 <= outcome.exit_code <= 255
        or (outcome.kind is None) != (outcome.exit_code == 0)
    ):
        raise ValueError(f"not an outcome: {line[:200]!r}")
    return outcome


class Leader:
    """The leader's side: hands out the key, collects readiness, broadcasts the outcome."""

    def __init__(
        self,
        *,
        address: str,
        port: int,
        workers: list[str],
        public_key: str,
        heartbeat_timeout: float,
        data_hosts: tuple[str, ...] = (),
    ):
        self.data_hosts = set(data_hosts)
        self.workers = set(workers) | self.data_hosts
        self.abort = threading.Event()  # set when a data host ended the job: stop the ranks
        self.ended: dict[str, Outcome] = {}  # data hosts whose script failed, and how
        self.public_key = public_key
        self.heartbeat_timeout = heartbeat_timeout
        self.host_keys: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        self.lost: dict[str, str] = {}  # workers lost while the job ran, and why
        self.peers: dict[str, _Connection] = {}
        self.said_bye: set[str] = set()
        self.addresses: dict[str, str] = {}
        self.pending = 0
        self.running = False
        self.outcome: Outcome | None = None
        self.condition = threading.Condition()
        try:
            self.server = socket.create_server((address, port))
        except OSError as error:
            raise PlatformError(
                f"the leader cannot listen on coordinator port {port} of "
                f"{address}: {error.strerror}; choose another "
                f"coordinator_port"
            ) from None
        threading.Thread(target=self._accept, daemon=True, name="coordinator").start()

    def _accept(self) -> None:
        while True:
            try:
                sock, (peer_address, *_) = self.server.accept()
            except OSError as error:
                if self.server.fileno() < 0 or error.errno == errno.EINVAL:
                    return  # closed by close()
                log(f"coordinator: accept failed ({error}); still listening")
                time.sleep(0.1)
                continue
            with self.condition:
                admitted = self.pending < MAX_PENDING
                self.pending += admitted
            if not admitted:
                sock.close()
                continue
            try:
                threading.Thread(
                    target=self._serve, args=(_Connection(sock), peer_address), daemon=True
                ).start()
            except Exception as error:  # no thread to be had: drop this one, keep listening
                log(f"coordinator: cannot serve {peer_address} ({error}); still listening")
                sock.close()
                with self.condition:
                    self.pending -= 1

    def _serve(self, peer: _Connection, peer_address: str) -> None:
        host = None
        try:
            host = self._admit(peer, peer_address)
            if host:
                self._follow(peer, host)
        except (OSError, ProtocolError, ValueError) as error:
            log(f"coordinator: dropped {host or peer_address}: {error or type(error).__name__}")
            self._lost(host, f"broke the protocol or the connection: {error}")
        except Exception as error:  # the coordinator must outlive any one connection
            log(f"coordinator: internal error serving {host or peer_address}: {error!r}")
        finally:
            peer.close()
            with self.condition:
                self.condition.notify_all()  # finish() waits for open connections only

    def _admit(self, peer: _Connection, peer_address: str) -> str | None:
        """The worker's host name once its HELLO is accepted and it has the key, else None."""
        started = time.monotonic()
        try:
            hello = peer.read(started + HELLO_TIMEOUT) or ""
        finally:
            with self.condition:
                self.pending -= 1
        host = hello[len("HELLO ") :].strip() if hello.startswith("HELLO ") else ""
        refusal = self._refusal(host, hello, peer_address)
        if refusal:
            log(f"coordinator: refused a connection from {peer_address}: {refusal}")
            return None
        with self.condition:
            if self.outcome is not None:
                peer.send(_exit_line(self.outcome))
                return None
            if host in self.peers or self.running:
                log(f"coordinator: refused a second connection for {host} from {peer_address}")
                return None
            self.peers[host] = peer
        peer.send(f"KEY {self.public_key}")
        peer.ping_until_closed()
        try:
            answer = (
                self._next_line(peer, started + HANDSHAKE_TIMEOUT)
                or "FAIL it closed the connection before reporting ready"
            )
        except TimeoutError:
            answer = (
                f"FAIL it went silent for {self.heartbeat_timeout:g} s or did not report "
                f"ready within {HANDSHAKE_TIMEOUT:g} s"
            )
        except (OSError, ProtocolError) as error:  # its failure, not a wait until host_timeout
            answer = f"FAIL it broke the protocol or the connection: {error}"
        verb, _, rest = answer.partition(" ")
        with self.condition:
            if verb == "READY" and rest.strip():
                self.host_keys[host] = rest.strip()
            else:
                self.failures[host] = rest if verb == "FAIL" else f"unexpected {verb!r}"
            self.condition.notify_all()
        return host if verb == "READY" else None

    def _refusal(self, host: str, hello: str, peer_address: str) -> str | None:
        if not host:
            return f"expected HELLO <host>, got {hello[:80]!r}"
        if host not in self.workers:
            return f"{host[:80]!r} is not a worker of this job"
        try:
            expected = self._address_of(host)
        except OSError as error:
            return f"{host} does not resolve here ({error})"
        if peer_address != expected:
            return f"it claims to be {host}, which resolves to {expected}"
        return None

    def _address_of(self, host: str) -> str:
        """A worker's address, looked up once: a name service that stalls for a moment (podman's
        resolver reloads as a container joins the network; glibc then waits 5 s per server)
        must not keep a stranger's refusal waiting, nor a worker's second attempt. It is also
        the address mpirun's ssh is pinned to (sshd.client_config): the one the worker came from."""
        if host not in self.addresses:
            self.addresses[host] = address_of(host)
        return self.addresses[host]

    def _next_line(self, peer: _Connection, deadline: float) -> str | None:
        """The next line that is not a heartbeat; socket.timeout when the worker is silent for
        heartbeat_timeout or the deadline passes."""
        while True:
            line = peer.read(min(deadline, time.monotonic() + self.heartbeat_timeout))
            if line != "PING":
                return line

    def _follow(self, peer: _Connection, host: str) -> None:
        """After READY: the worker's heartbeats until BYE; silence or a close means it is lost."""
        while True:
            try:
                line = self._next_line(peer, float("inf"))
            except TimeoutError:
                self._lost(host, f"silent for {self.heartbeat_timeout:g} s")
                return
            if line == "BYE":
                with self.condition:
                    self.said_bye.add(host)
                    self.condition.notify_all()
                return
            if line is not None and line.startswith("ENDED ") and host in self.data_hosts:
                ended = _outcome(line)
                if ended.kind is None:  # its script failed, or it would not say ENDED
                    raise ValueError(f"ENDED without a failure: {line[:200]!r}")
                log(f"coordinator: the script on data host {host} failed: {ended.reason}")
                with self.condition:
                    self.ended.setdefault(host, ended)
                self.abort.set()
                continue
            if line is None:
                self._lost(host, "it closed the connection")
                return
            if line.startswith("READY"):
                log(f"coordinator: ignored a second READY from {host}")

    def _lost(self, host: str | None, why: str) -> None:
        with self.condition:
            if host is None or self.outcome is not None or host in self.said_bye:
                return
            if not self.running:
                self.failures.setdefault(host, f"lost contact before the job started: {why}")
            else:
                self.lost.setdefault(host, why)
            self.condition.notify_all()
        log(f"coordinator: lost contact with worker {host}: {why}")
        if host in self.data_hosts:  # no rank of its own fails with it: stop them
            self.abort.set()

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
                    self.running = True
                    return {
                        host: key
                        for host, key in self.host_keys.items()
                        if host not in self.data_hosts
                    }
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PlatformError(
                        f"these workers never reported ready within {timeout:g} s: "
                        f"{', '.join(missing)} (is the container running there, and can it "
                        f"reach this leader?)"
                    )
                self.condition.wait(left)

    def root_cause(self, outcome: Outcome) -> Outcome:
        """A failed job whose worker host vanished while it ran failed because of that host:
        the ranks' own errors (a peer's connection reset, seen in about a second with
        TensorFlow's collectives) are its consequence, whichever mpirun reported first."""
        with self.condition:
            lost = next(iter(self.lost.items()), None)
            ended = next(iter(self.ended.items()), None)
        if outcome.kind is not None and ended is not None:
            host, how = ended
            return Outcome(
                FailureKind.CLUSTER,
                f"data host {host}: {how.reason}; the training on every host was stopped",
                how.exit_code,
            )
        if outcome.kind is None or lost is None:
            return outcome
        host, why = lost
        return Outcome.failed(
            FailureKind.CLUSTER,
            (
                f"lost contact with host {host}: {why} (host killed, out of memory or network "
                f"down); the job on every host was stopped"
            ),
        )

    def finish(self, outcome: Outcome, timeout: float = 5.0) -> None:
        """Tell every connected worker the outcome and wait (briefly) until they have it."""
        with self.condition:
            self.outcome = outcome
            peers = dict(self.peers)
        for peer in peers.values():  # each its own thread: a stuck peer delays no other
            threading.Thread(target=peer.send, args=(_exit_line(outcome),), daemon=True).start()
        deadline = time.monotonic() + timeout
        with self.condition:
            while time.monotonic() < deadline and any(
                host not in self.said_bye and not peer.closed.is_set()
                for host, peer in peers.items()
            ):
                self.condition.wait(deadline - time.monotonic())
        for peer in peers.values():
            peer.close()
        self.close()

    def close(self) -> None:
        """Stop listening (shutdown first: a plain close leaves accept() blocked, listening)."""
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()


def follow_leader(
    leader: str,
    port: int,
    host: str,
    *,
    address: str,
    leader_timeout: float,
    heartbeat_timeout: float,
    on_key: Callable[[str], str],
    on_ready: Callable[[Callable[[str], bool]], None] = lambda send: None,
) -> Outcome:
    """The worker's side: the job's outcome as the leader reports it.

    `address` is this host's cluster address (the leader accepts this host only from it);
    `on_key(public_key)` prepares this host (starts its sshd) and returns the host key;
    `on_ready(send)` runs once the leader has it, with a way to send the leader a line later
    (a data host's ENDED). A leader that closes the connection before answering (it is busy:
    too many connections) is tried again until `leader_timeout`.
    """
    deadline = time.monotonic() + leader_timeout
    while True:
        peer = _Connection(_connect(leader, port, address, deadline, leader_timeout))
        try:
            peer.send(f"HELLO {host}")
            peer.ping_until_closed()
            try:
                line = _expect(peer, leader, heartbeat_timeout)
            except _Closed:
                if time.monotonic() < deadline:
                    time.sleep(1.0)
                    continue
                raise PlatformError(
                    f"the leader {leader} refused this host until leader_timeout "
                    f"({leader_timeout:g} s): does {host} resolve on the leader to this host's "
                    f"address {address}?"
                ) from None
            return (
                line
                if isinstance(line, Outcome)
                else _serve_leader(peer, line, leader, heartbeat_timeout, on_key, on_ready)
            )
        finally:
            peer.close()


def _serve_leader(
    peer: _Connection,
    key_line: str,
    leader: str,
    heartbeat_timeout: float,
    on_key: Callable[[str], str],
    on_ready: Callable[[Callable[[str], bool]], None],
) -> Outcome:
    try:
        host_key = on_key(key_line.partition(" ")[2])
    except TrainError as error:
        peer.send(f"FAIL {error}")
        raise
    peer.send(f"READY {host_key}")
    on_ready(peer.send)
    try:
        outcome = _expect(peer, leader, heartbeat_timeout)
    except _Closed:
        raise PlatformError(
            f"lost contact with the leader {leader}: it closed the "
            f"connection before reporting the job's outcome"
        ) from None
    if not isinstance(outcome, Outcome):
        raise PlatformError(f"the leader {leader} sent {outcome[:80]!r} instead of the outcome")
    peer.send("BYE")
    return outcome


def _connect(
    leader: str, port: int, address: str, deadline: float, timeout: float
) -> socket.socket:
    """A connection to the leader from this host's address, retried until `deadline`."""
    delay = 0.1
    while True:
        try:
            return socket.create_connection((leader, port), timeout=5, source_address=(address, 0))
        except OSError as error:
            if time.monotonic() + delay >= deadline:
                raise PlatformError(
                    f"the leader {leader} never answered on port {port} within {timeout:g} s "
                    f"({error.strerror or error}): it has not started, or it has already "
                    f"ended (a leader waits host_timeout for its workers, then fails)"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class _Closed(Exception):
    """The leader closed the connection."""


def _expect(peer: _Connection, leader: str, timeout: float) -> str | Outcome:
    """The leader's next line that is not a heartbeat, as an Outcome if it is EXIT."""
    try:
        while (line := peer.read(time.monotonic() + timeout)) == "PING":
            pass
    except TimeoutError:
        raise PlatformError(
            f"lost contact with the leader {leader}: silent for {timeout:g} s"
        ) from None
    except ConnectionResetError:
        raise _Closed() from None
    except (OSError, ProtocolError) as error:
        raise PlatformError(f"lost contact with the leader {leader}: {error}") from None
    if line is None:
        raise _Closed()
    if not line.startswith("EXIT "):
        return line
    try:
        return _outcome(line)
    except ValueError:
        raise PlatformError(
            f"the leader {leader} sent a malformed outcome: {line[:200]!r}"
        ) from None
