"""Leader and workers agree on the job over one TCP connection per worker.

This replaces the toolkit's fixed sleeps and `/tmp/done` files polled over ssh. A worker says
HELLO with its host name, the leader hands it the job's ssh public key (KEY), the worker starts
its sshd and reports READY with that sshd's host key (or FAIL), and when the job has ended the
leader sends every worker its outcome (EXIT), which the worker acknowledges (BYE). The
messages, one line each, are container.messages': written and read there only.

A worker that cannot get ready says why in FAIL, with its error's kind, and exits with that
error; the leader fails the job with an error of the same kind (a port held on the worker is
the user's to move: exit 2 on every host, not 3). A worker the leader gives up on itself
(silent, closed, broke the protocol) is the cluster's failure (3).

A data host (a heterogeneous job's host that runs no rank, container.data_host) takes part as a
worker does, with `-` for a host key (it runs no sshd). Its script runs beside the training:
when the script fails (it says ENDED), or the host falls silent, the leader stops the training
(`abort`) and the job fails with the data host's reason.

Hosts start in any order: a worker retries until `leader_timeout`, the leader waits
`host_timeout` for every worker. Both sides send PING every second from the first contact, so
neither waits on a silent peer: a worker whose leader goes silent (killed, crashed) gives up
after `heartbeat_timeout` naming the leader, and a worker that goes silent before the job
starts fails the job naming that worker. A worker exits within a second of the leader's
mpirun ending, with the leader's exit code and the root cause.

The leader's state is written down: the job's `Phase` (gathering the hosts, running,
finished) and each admitted host's `PeerState` (joined, ready, failed, lost, left). A host
lost while the job runs, or a data host's failed script, is the root cause of the job's
failure (`Leader.root_cause`).

A rank killed by SIGKILL on a worker's host was out of memory for certain only if that host's
memory cgroup counted an OOM kill, which only that host can read: when mpirun reports such a
kill, the leader asks the worker (MEMORY) and its launcher answers with what its cgroup counted
(OOM_KILLS), which the failure's reason then names (`Leader.memory_of`, container.failure).
Only kills since the attempt started prove anything (container.oom.since): an earlier attempt's
kill there says nothing of this one's SIGKILL. The workers are not told of restarts (the leader
alone runs mpirun, container.restarts), so the leader keeps each worker's start: it asks every
ready worker the same question as each attempt starts (`Leader.start_attempt`) and answers
`memory_of` with the difference. Asked, not pushed: the kernel counts an OOM kill as it sends the SIGKILL, long before mpirun
hears of the death, so the count is there when asked, and no worker polls its cgroup meanwhile.
The question waits at most MEMORY_TIMEOUT for the answer: the job's end is never held longer.

Only the cluster is heard. The coordinator listens on the leader's cluster address and
accepts `HELLO <host>` only from the address `<host>` resolves to, only once per host and
only before the job runs (`_Gate`); anyone else is logged and disconnected before seeing the
key. Input is bounded: lines of at most MAX_LINE bytes, HELLO within HELLO_TIMEOUT of
connecting and READY within HANDSHAKE_TIMEOUT, at most MAX_PENDING connections that have not
said who they are. Each connection has its own threads and a send timeout, so one slow or dead
peer never delays another's heartbeats.
"""

from __future__ import annotations

import errno
import select
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

from container.failure import Outcome, relayed
from container.logs import log
from container.messages import BYE, MEMORY, PING, MalformedMessage, Message, Verb, parse
from container.network import address_of
from container.oom import CgroupMemory, read_memory, since
from job.errors import PlatformError, TrainError, error_of
from job.protocol import FailureKind

HEARTBEAT_INTERVAL = 1.0
MAX_LINE = 64 * 1024
HELLO_TIMEOUT = 10.0
HANDSHAKE_TIMEOUT = 120.0
SEND_TIMEOUT = 10.0
MAX_PENDING = 32
# How long the leader waits for a worker's answer to MEMORY: a round trip on the cluster's
# network and a read of two small files, milliseconds; only a dead or stuck worker takes it all.
MEMORY_TIMEOUT = 2.0


class ProtocolError(Exception):
    """A peer broke the protocol (a line too long, a handshake too slow)."""


class _Connection:
    """One peer: lines in with deadlines, messages out under a lock, PING every second."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sock.settimeout(SEND_TIMEOUT)  # bounds sendall; reads wait with select
        self.buffer = b""
        self.lock = threading.Lock()
        self.closed = threading.Event()

    def send(self, message: Message) -> bool:
        with self.lock:
            if self.closed.is_set():
                return False
            try:
                self.sock.sendall(message.line().encode() + b"\n")
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

    def next_message(self, deadline: float, silence: float) -> Message | None:
        """The next message that is not a heartbeat; None at end of stream; TimeoutError when
        the peer is silent for `silence` seconds or the deadline passes; MalformedMessage for a
        line that is no message."""
        while True:
            line = self.read(min(deadline, time.monotonic() + silence))
            if line is None:
                return None
            message = parse(line)
            if message.verb is not Verb.PING:
                return message

    def ping_until_closed(self) -> None:
        threading.Thread(target=self._ping, daemon=True, name="heartbeat").start()

    def _ping(self) -> None:
        while not self.closed.wait(HEARTBEAT_INTERVAL):
            self.send(PING)

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


class _Gate:
    """Admission: how many connections may wait to say who they are, and whether a HELLO is
    believed. Its own lock: a stranger's refusal never waits on the job's state."""

    def __init__(self, hosts: set[str]):
        self.hosts = hosts
        self.addresses: dict[str, str] = {}  # host -> the address it must come from
        self.pending = 0
        self.lock = threading.Lock()

    def enter(self) -> bool:
        """Room for one more connection that has not said who it is (at most MAX_PENDING)."""
        with self.lock:
            admitted = self.pending < MAX_PENDING
            self.pending += admitted
            return admitted

    def leave(self) -> None:
        """A connection said who it is, or gave up."""
        with self.lock:
            self.pending -= 1

    def authenticate(self, hello: str, peer_address: str) -> str | None:
        """The host a HELLO line names, if it is one of the job's and came from its address;
        None (the refusal logged) otherwise."""
        try:
            message: Message | None = parse(hello)
        except MalformedMessage:
            message = None
        host = message.text if message and message.verb is Verb.HELLO else ""
        refusal = (
            self._refusal(host, peer_address)
            if host
            else f"expected HELLO <host>, got {hello[:80]!r}"
        )
        if refusal:
            log.info(f"coordinator: refused a connection from {peer_address}: {refusal}")
            return None
        return host

    def _refusal(self, host: str, peer_address: str) -> str | None:
        if host not in self.hosts:
            return f"{host[:80]!r} is not a worker of this job"
        try:
            expected = self.address_of(host)
        except OSError as error:
            return f"{host} does not resolve here ({error})"
        if peer_address != expected:
            return f"it claims to be {host}, which resolves to {expected}"
        return None

    def address_of(self, host: str) -> str:
        """A worker's address, looked up once: a name service that stalls for a moment (podman's
        resolver reloads as a container joins the network; glibc then waits 5 s per server)
        must not keep a stranger's refusal waiting, nor a worker's second attempt. It is also
        the address mpirun's ssh is pinned to (sshd.client_config): the one the worker came from."""
        if host not in self.addresses:
            self.addresses[host] = address_of(host)
        return self.addresses[host]


class Phase(Enum):
    """Where the job is, as the leader sees it (torchrun's agent has its WorkerState)."""

    GATHERING = "gathering"  # hosts join and get ready; one lost now fails the start
    RUNNING = "running"  # every host is ready, the job runs; one lost now is the root cause
    FINISHED = "finished"  # the outcome is known and sent to every host, and to late comers


class PeerState(Enum):
    """Where one admitted host is."""

    JOINED = "joined"  # its HELLO was believed and it has the key; its answer is awaited
    READY = "ready"  # it reported ready with its host key
    FAILED = "failed"  # it could not get ready, or was lost before the job ran
    LOST = "lost"  # it fell silent or its connection closed while the job ran
    LEFT = "left"  # it said BYE: it has the outcome


@dataclass
class Peer:
    """An admitted host: its connection and state, and what it said or what became of it."""

    connection: _Connection
    state: PeerState = PeerState.JOINED
    host_key: str = ""  # READY's; kept after it is lost or has left
    why: str = ""  # why it FAILED or was LOST
    failure: FailureKind = FailureKind.CLUSTER  # why it FAILED: its FAIL's kind, else the cluster
    ended: Outcome | None = None  # a data host's failed script (ENDED)
    memory: CgroupMemory | None = None  # its last OOM_KILLS (None: it cannot read its cgroup)
    memory_answers: int = 0  # how many OOM_KILLS it sent: an answer is one counted after asking


class _Roster:
    """The job's phase and every admitted host's state, under one Condition that the waits
    for readiness and for the outcome's delivery wait on. The first host to fail, to be lost
    and to end is kept: the job's failure names it (root_cause), whatever happened later."""

    def __init__(self, hosts: set[str]):
        self.hosts = hosts
        self.condition = threading.Condition()
        self.phase = Phase.GATHERING
        self.outcome: Outcome | None = None
        self.peers: dict[str, Peer] = {}
        self.first_failed: str | None = None
        self.first_lost: str | None = None
        self.first_ended: str | None = None

    def join(self, host: str, connection: _Connection) -> Outcome | bool:
        """The outcome when the job has ended (the late comer is told it); else whether the
        host joined: once per host, and only while the hosts gather."""
        with self.condition:
            if self.outcome is not None:
                return self.outcome
            if host in self.peers or self.phase is not Phase.GATHERING:
                return False
            self.peers[host] = Peer(connection)
            return True

    def ready(self, host: str, host_key: str) -> None:
        with self.condition:
            peer = self.peers[host]
            peer.state, peer.host_key = PeerState.READY, host_key
            self.condition.notify_all()

    def fail(self, host: str, kind: FailureKind, why: str) -> None:
        with self.condition:
            self._set(host, PeerState.FAILED, why)
            self.peers[host].failure = kind
            self.condition.notify_all()

    def lose(self, host: str, why: str) -> bool:
        """Record that the host was lost; False when that no longer matters (the job has
        finished, or the host had the outcome)."""
        with self.condition:
            peer = self.peers[host]
            if self.phase is Phase.FINISHED or peer.state is PeerState.LEFT:
                return False
            if self.phase is Phase.GATHERING:
                if peer.state is not PeerState.FAILED:
                    self._set(host, PeerState.FAILED, f"lost contact before the job started: {why}")
            elif peer.state is not PeerState.LOST:
                self._set(host, PeerState.LOST, why)
            self.condition.notify_all()
            return True

    def end(self, host: str, outcome: Outcome) -> None:
        """A data host's script failed: the first report of each host counts."""
        with self.condition:
            peer = self.peers[host]
            if peer.ended is None:
                peer.ended = outcome
                self.first_ended = self.first_ended or host

    def answer_memory(self, host: str, memory: CgroupMemory | None) -> None:
        with self.condition:
            peer = self.peers[host]
            peer.memory, peer.memory_answers = memory, peer.memory_answers + 1
            self.condition.notify_all()

    def wait_memory(self, host: str, answers: int, timeout: float) -> CgroupMemory | None:
        """The host's answer once it has sent more than `answers` OOM_KILLS; None if it has
        not within `timeout`, or its connection closed first."""
        deadline = time.monotonic() + timeout
        with self.condition:
            peer = self.peers[host]
            while peer.memory_answers <= answers:
                left = deadline - time.monotonic()
                if left <= 0 or peer.connection.closed.is_set():
                    return None
                self.condition.wait(left)
            return peer.memory

    def leave(self, host: str) -> None:
        with self.condition:
            self.peers[host].state = PeerState.LEFT
            self.condition.notify_all()

    def _set(self, host: str, state: PeerState, why: str) -> None:
        peer = self.peers[host]
        peer.state, peer.why = state, why
        if state is PeerState.FAILED:
            self.first_failed = self.first_failed or host
        if state is PeerState.LOST:
            self.first_lost = self.first_lost or host

    def wait_ready(self, timeout: float) -> dict[str, str]:
        """Block until every host is ready (the job then runs); returns host -> host key.
        The error of the first host that could not, of the kind it failed with (job.errors:
        a worker's own error's kind, PlatformError when the leader gave up on it); a
        PlatformError naming those that never said."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while True:
                if self.first_failed is not None:
                    host = self.first_failed
                    peer = self.peers[host]
                    raise error_of(peer.failure)(f"worker {host} could not get ready: {peer.why}")
                missing = sorted(
                    host
                    for host in self.hosts
                    if host not in self.peers or not self.peers[host].host_key
                )
                if not missing:
                    self.phase = Phase.RUNNING
                    return {host: peer.host_key for host, peer in self.peers.items()}
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PlatformError(
                        f"these workers never reported ready within {timeout:g} s: "
                        f"{', '.join(missing)} (is the container running there, and can it "
                        f"reach this leader?)"
                    )
                self.condition.wait(left)

    def root_cause(self, outcome: Outcome) -> Outcome:
        """The job's outcome, or the host that caused its failure: a data host whose script
        failed, else a host lost while the job ran."""
        with self.condition:
            lost_host, ended_host = self.first_lost, self.first_ended
            why = self.peers[lost_host].why if lost_host else ""
            ended = self.peers[ended_host].ended if ended_host else None
        if outcome.kind is not None and ended is not None:
            return Outcome(
                FailureKind.CLUSTER,
                f"data host {ended_host}: {ended.reason}; the training on every host was stopped",
                ended.exit_code,
            )
        if outcome.kind is None or lost_host is None:
            return outcome
        return Outcome.failed(
            FailureKind.CLUSTER,
            (
                f"lost contact with host {lost_host}: {why} (host killed, out of memory or "
                f"network down); the job on every host was stopped"
            ),
        )

    def finish(self, outcome: Outcome) -> dict[str, Peer]:
        """The job has ended: the hosts to tell."""
        with self.condition:
            self.phase, self.outcome = Phase.FINISHED, outcome
            return dict(self.peers)

    def wait_told(self, peers: dict[str, Peer], timeout: float) -> None:
        """Block until every host of `peers` has the outcome or is gone, at most `timeout`."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while time.monotonic() < deadline and not all(
                peer.state is PeerState.LEFT or peer.connection.closed.is_set()
                for peer in peers.values()
            ):
                self.condition.wait(deadline - time.monotonic())


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
        hosts = set(workers) | self.data_hosts
        self.gate = _Gate(hosts)
        self.roster = _Roster(hosts)
        self.abort = threading.Event()  # set when a data host ended the job: stop the ranks
        self.public_key = public_key
        self.heartbeat_timeout = heartbeat_timeout
        # each worker's memory cgroup as the current attempt started (None: it did not answer)
        self.attempt_start: dict[str, CgroupMemory | None] = {}
        try:
            self.server = socket.create_server((address, port))
        except OSError as error:
            raise PlatformError(
                f"the leader cannot listen on coordinator port {port} of "
                f"{address}: {error.strerror}; choose another "
                f"coordinator_port"
            ) from None
        threading.Thread(target=self._accept, daemon=True, name="coordinator").start()

    @property
    def addresses(self) -> dict[str, str]:
        """host -> the address it came from (mpirun's ssh is pinned to it)."""
        return self.gate.addresses

    def _accept(self) -> None:
        while True:
            try:
                sock, (peer_address, *_) = self.server.accept()
            except OSError as error:
                if self.server.fileno() < 0 or error.errno == errno.EINVAL:
                    return  # closed by close()
                log.info(f"coordinator: accept failed ({error}); still listening")
                time.sleep(0.1)
                continue
            if not self.gate.enter():
                sock.close()
                continue
            try:
                threading.Thread(
                    target=self._serve, args=(_Connection(sock), peer_address), daemon=True
                ).start()
            except Exception as error:  # no thread to be had: drop this one, keep listening
                log.info(f"coordinator: cannot serve {peer_address} ({error}); still listening")
                sock.close()
                self.gate.leave()

    def _serve(self, peer: _Connection, peer_address: str) -> None:
        host = None
        try:
            host = self._admit(peer, peer_address)
            if host:
                self._follow(peer, host)
        except (OSError, ProtocolError, ValueError) as error:
            log.info(
                f"coordinator: dropped {host or peer_address}: {error or type(error).__name__}"
            )
            if host:
                self._lost(host, f"broke the protocol or the connection: {error}")
        except Exception as error:  # the coordinator must outlive any one connection
            log.info(f"coordinator: internal error serving {host or peer_address}: {error!r}")
        finally:
            peer.close()
            with self.roster.condition:
                self.roster.condition.notify_all()  # finish() waits for open connections only

    def _admit(self, peer: _Connection, peer_address: str) -> str | None:
        """The worker's host name once its HELLO is believed and it reported ready, else None."""
        started = time.monotonic()
        try:
            hello = peer.read(started + HELLO_TIMEOUT) or ""
        finally:
            self.gate.leave()
        host = self.gate.authenticate(hello, peer_address)
        if host is None:
            return None
        joined = self.roster.join(host, peer)
        if isinstance(joined, Outcome):
            peer.send(Message(Verb.EXIT, outcome=joined))
            return None
        if not joined:
            log.info(f"coordinator: refused a second connection for {host} from {peer_address}")
            return None
        peer.send(Message(Verb.KEY, self.public_key))
        peer.ping_until_closed()
        answer = self._answer(peer, started + HANDSHAKE_TIMEOUT)
        if answer.kind is not None:  # FAIL
            self.roster.fail(host, answer.kind, answer.text)
            return None
        self.roster.ready(host, answer.text)
        return host

    def _answer(self, peer: _Connection, deadline: float) -> Message:
        """The worker's answer to KEY: READY, or a FAIL with why it will not be ready, its own
        (of its error's kind) or the leader's (it went silent, closed the connection or broke
        the protocol: named now, not after host_timeout; the cluster's failure)."""
        try:
            answer = peer.next_message(deadline, self.heartbeat_timeout)
        except TimeoutError:
            return _cluster_fail(
                f"it went silent for {self.heartbeat_timeout:g} s or did not report "
                f"ready within {HANDSHAKE_TIMEOUT:g} s"
            )
        except (OSError, ProtocolError, MalformedMessage) as error:
            return _cluster_fail(f"it broke the protocol or the connection: {error}")
        if answer is None:
            return _cluster_fail("it closed the connection before reporting ready")
        if answer.verb in (Verb.READY, Verb.FAIL):
            return answer
        return _cluster_fail(f"unexpected {answer.verb.value!r}")

    def _follow(self, peer: _Connection, host: str) -> None:
        """After READY: the worker's heartbeats until BYE; silence or a close means it is lost."""
        while True:
            try:
                message = peer.next_message(float("inf"), self.heartbeat_timeout)
            except TimeoutError:
                self._lost(host, f"silent for {self.heartbeat_timeout:g} s")
                return
            except MalformedMessage as error:
                if error.verb is Verb.ENDED and host in self.data_hosts:
                    raise  # a data host that cannot say how its script ended is dropped
                continue  # a worker's stray line: it has nothing more to tell the leader
            if message is None:
                self._lost(host, "it closed the connection")
                return
            if message.verb is Verb.BYE:
                self.roster.leave(host)
                return
            if message.verb is Verb.ENDED and message.outcome and host in self.data_hosts:
                log.info(
                    f"coordinator: the script on data host {host} failed: {message.outcome.reason}"
                )
                self.roster.end(host, message.outcome)
                self.abort.set()
            elif message.verb is Verb.OOM_KILLS:
                self.roster.answer_memory(host, message.memory)
            elif message.verb is Verb.READY:
                log.info(f"coordinator: ignored a second READY from {host}")

    def _lost(self, host: str, why: str) -> None:
        if not self.roster.lose(host, why):
            return
        log.info(f"coordinator: lost contact with worker {host}: {why}")
        if host in self.data_hosts:  # no rank of its own fails with it: stop them
            self.abort.set()

    def wait_ready(self, timeout: float) -> dict[str, str]:
        """Block until every worker is ready; returns host -> sshd host key."""
        keys = self.roster.wait_ready(timeout)
        return {host: key for host, key in keys.items() if host not in self.data_hosts}

    def start_attempt(self, timeout: float = MEMORY_TIMEOUT) -> None:
        """Ask every ready worker what its memory cgroup counted as an attempt starts (all at
        once: at most `timeout` in all), the start `memory_of` counts from."""
        with self.roster.condition:
            hosts = [host for host in self.roster.peers if host not in self.data_hosts]
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as asking:
            answers = asking.map(lambda host: self._ask(host, timeout), hosts)
            self.attempt_start = dict(zip(hosts, answers, strict=True))

    def memory_of(self, host: str, timeout: float = MEMORY_TIMEOUT) -> CgroupMemory | None:
        """The OOM kills the worker `host`'s memory cgroup counted since the attempt started
        (start_attempt), asked now over its connection (container.failure.summarize's
        `memory_of`); None when its start is unknown, or it is no worker that is ready and
        connected, cannot read its cgroup, or does not answer within `timeout`."""
        start = self.attempt_start.get(host)
        return None if start is None else since(self._ask(host, timeout), start)

    def _ask(self, host: str, timeout: float) -> CgroupMemory | None:
        """What the worker `host` reads of its memory cgroup now (MEMORY, OOM_KILLS)."""
        with self.roster.condition:
            peer = self.roster.peers.get(host)
            if peer is None or peer.state is not PeerState.READY or host in self.data_hosts:
                return None
            answers = peer.memory_answers
        # its own thread, as finish's EXIT: a stuck peer's send waits no longer than `timeout`
        threading.Thread(target=peer.connection.send, args=(MEMORY,), daemon=True).start()
        return self.roster.wait_memory(host, answers, timeout)

    def root_cause(self, outcome: Outcome) -> Outcome:
        """A failed job whose worker host vanished while it ran failed because of that host:
        the ranks' own errors (a peer's connection reset, seen in about a second with
        TensorFlow's collectives) are its consequence, whichever mpirun reported first."""
        return self.roster.root_cause(outcome)

    def finish(self, outcome: Outcome, timeout: float = 5.0) -> None:
        """Tell every connected worker the outcome and wait (briefly) until they have it."""
        peers = self.roster.finish(outcome)
        exit_message = Message(Verb.EXIT, outcome=outcome)
        for peer in peers.values():  # each its own thread: a stuck peer delays no other
            threading.Thread(target=peer.connection.send, args=(exit_message,), daemon=True).start()
        self.roster.wait_told(peers, timeout)
        for peer in peers.values():
            peer.connection.close()
        self.close()

    def close(self) -> None:
        """Stop listening (shutdown first: a plain close leaves accept() blocked, listening)."""
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()


def _cluster_fail(why: str) -> Message:
    """A FAIL the leader makes up for a worker it gave up on: the cluster's failure."""
    return Message(Verb.FAIL, why, kind=FailureKind.CLUSTER)


def follow_leader(
    leader: str,
    port: int,
    host: str,
    *,
    address: str,
    leader_timeout: float,
    heartbeat_timeout: float,
    on_key: Callable[[str], str],
    on_ready: Callable[[Callable[[Message], bool]], None] = lambda send: None,
    memory: Callable[[], CgroupMemory | None] = read_memory,
) -> Outcome:
    """The worker's side: the job's outcome as the leader reports it.

    `address` is this host's cluster address (the leader accepts this host only from it);
    `on_key(public_key)` prepares this host (starts its sshd) and returns the host key;
    `on_ready(send)` runs once the leader has it, with a way to send the leader a message later
    (a data host's ENDED); `memory()` reads this host's memory cgroup when the leader asks
    (MEMORY). A leader that closes the connection before answering (it is busy: too many
    connections) is tried again until `leader_timeout`.
    """
    deadline = time.monotonic() + leader_timeout
    while True:
        peer = _Connection(_connect(leader, port, address, deadline, leader_timeout))
        try:
            peer.send(Message(Verb.HELLO, host))
            peer.ping_until_closed()
            try:
                message = _hear(peer, leader, heartbeat_timeout)
            except _Closed:
                if time.monotonic() < deadline:
                    time.sleep(1.0)
                    continue
                raise PlatformError(
                    f"the leader {leader} refused this host until leader_timeout "
                    f"({leader_timeout:g} s): does {host} resolve on the leader to this host's "
                    f"address {address}?"
                ) from None
            if message.outcome is not None and message.verb is Verb.EXIT:
                return message.outcome  # the job ended before this host joined
            if message.verb is not Verb.KEY:
                raise _unexpected(leader, message, "the job's key")
            return _serve_leader(
                peer, message.text, leader, heartbeat_timeout, on_key, on_ready, memory
            )
        finally:
            peer.close()


def _serve_leader(
    peer: _Connection,
    public_key: str,
    leader: str,
    heartbeat_timeout: float,
    on_key: Callable[[str], str],
    on_ready: Callable[[Callable[[Message], bool]], None],
    memory: Callable[[], CgroupMemory | None],
) -> Outcome:
    try:
        host_key = on_key(public_key)
    except TrainError as error:  # the leader fails the job with an error of the same kind
        peer.send(Message(Verb.FAIL, str(error), kind=error.kind))
        raise
    peer.send(Message(Verb.READY, host_key))
    on_ready(peer.send)
    try:
        message = _hear(peer, leader, heartbeat_timeout)
        while message.verb is Verb.MEMORY:  # a rank here was killed: was it out of memory?
            peer.send(Message(Verb.OOM_KILLS, memory=memory()))
            message = _hear(peer, leader, heartbeat_timeout)
    except _Closed:
        raise PlatformError(
            f"lost contact with the leader {leader}: it closed the "
            f"connection before reporting the job's outcome"
        ) from None
    if message.outcome is None or message.verb is not Verb.EXIT:
        raise _unexpected(leader, message, "the outcome")
    peer.send(BYE)
    return message.outcome


def leaders_outcome(
    outcome: Outcome,
    host: str,
    leader: str,
    memory: Callable[[], CgroupMemory | None],
) -> Outcome:
    """How a worker or a data host ends: it says what the leader reported and returns this
    host's copy of the outcome (container.failure.relayed, with this host's memory cgroup as
    `memory` reads it: a worker's counts from its launcher's start)."""
    log.info(f"the leader {leader} reports exit code {outcome.exit_code}")
    return relayed(outcome, host, leader, memory)


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


def _hear(peer: _Connection, leader: str, timeout: float) -> Message:
    """The leader's next message that is not a heartbeat."""
    try:
        message = peer.next_message(float("inf"), timeout)
    except TimeoutError:
        raise PlatformError(
            f"lost contact with the leader {leader}: silent for {timeout:g} s"
        ) from None
    except ConnectionResetError:
        raise _Closed() from None
    except MalformedMessage as error:
        what = "a malformed outcome" if error.verb is Verb.EXIT else "a line that is no message"
        raise PlatformError(f"the leader {leader} sent {what}: {error.line[:200]!r}") from None
    except (OSError, ProtocolError) as error:
        raise PlatformError(f"lost contact with the leader {leader}: {error}") from None
    if message is None:
        raise _Closed()
    return message


def _unexpected(leader: str, message: Message, expected: str) -> PlatformError:
    return PlatformError(f"the leader {leader} sent {message.line()[:80]!r} instead of {expected}")
