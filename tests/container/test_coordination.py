"""The leader/worker protocol over real TCP sockets on loopback.

The leader listens on 127.0.0.1; the workers are the hosts 127.0.0.2 and 127.0.0.3, whose
names resolve to themselves, so "a worker only from the address its name resolves to" is
checked for real: a stranger is any socket bound to another loopback address.
"""

import socket
import threading
import time

import pytest

from container import coordination
from container.coordination import Leader, follow_leader
from container.failure import Outcome, OutputLog, summarize
from container.network import free_port
from container.oom import CgroupMemory, killed
from job.errors import ConfigError, PlatformError, TrainError
from job.protocol import FailureKind
from tests.waiting import eventually

LEADER = "127.0.0.1"
WORKERS = ["127.0.0.2", "127.0.0.3"]
FAILED = Outcome.failed(FailureKind.CONFIG, "rank 1 on host 127.0.0.2 failed (config error)")


def start_leader(port, workers=WORKERS, heartbeat_timeout=2):
    return Leader(
        address=LEADER,
        port=port,
        workers=workers,
        public_key="ssh-ed25519 AAAA job",
        heartbeat_timeout=heartbeat_timeout,
    )


def host_keys(leader) -> dict[str, str]:
    """The host keys the leader holds, of the hosts that reported ready."""
    with leader.roster.condition:
        return {host: peer.host_key for host, peer in leader.roster.peers.items() if peer.host_key}


def succeed(leader, threads, ready_within: float) -> None:
    """Wait for every worker to be ready, end the job successfully, and join the workers."""
    leader.wait_ready(timeout=ready_within)
    leader.finish(Outcome.success())
    for thread in threads:
        thread.join(timeout=5)


def follow(port, host, results, **overrides):
    options = dict(
        address=host,
        leader_timeout=10,
        heartbeat_timeout=2,
        on_key=lambda key: f"hostkey-of-{host}-for-{key}",
    )
    options.update(overrides)
    try:
        results[host] = follow_leader(LEADER, port, host, **options)
    except TrainError as error:
        results[host] = error


def start_worker(port, host, results, delay=0.0, **overrides):
    def run():
        time.sleep(delay)
        follow(port, host, results, **overrides)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def stranger(port, source="127.0.0.9"):
    return socket.create_connection((LEADER, port), timeout=5, source_address=(source, 0))


def fake_leader(says: bytes) -> int:
    """The port of a leader that is not ours: it accepts one worker, answers its HELLO with
    `says` and then stays silent, reading until the worker hangs up."""
    server = socket.create_server((LEADER, 0))

    def serve():
        connection, _ = server.accept()
        with server, connection:
            try:
                connection.recv(100)
                connection.sendall(says)
                while connection.recv(100):
                    pass
            except OSError:
                pass  # the worker hung up hard: as good as a close

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def follow_fake_leader(port, on_key):
    return follow_leader(
        LEADER,
        port,
        "127.0.0.2",
        address="127.0.0.2",
        leader_timeout=5,
        heartbeat_timeout=2,
        on_key=on_key,
    )


def closed_without_a_word(connection, timeout=5.0):
    """True when the leader closed this connection and never sent it a byte."""
    connection.settimeout(timeout)
    try:
        return connection.recv(100_000) == b""
    except ConnectionResetError:
        return True


def test_workers_get_the_key_and_the_outcome():
    port, results = free_port(), {}
    leader = start_leader(port)
    threads = [start_worker(port, host, results) for host in WORKERS]
    keys = leader.wait_ready(timeout=10)
    assert keys == {h: f"hostkey-of-{h}-for-ssh-ed25519 AAAA job" for h in WORKERS}
    time.sleep(3)  # longer than heartbeat_timeout: heartbeats flow both ways meanwhile
    assert all(t.is_alive() for t in threads)
    leader.finish(FAILED)
    for thread in threads:
        thread.join(timeout=5)
    assert results == {host: FAILED for host in WORKERS}


def test_a_worker_ready_long_before_the_last_one_keeps_waiting():
    # A worker ready 2x heartbeat_timeout before the other: the leader's PINGs start at its
    # first contact, not when every worker is ready.
    port, results = free_port(), {}
    leader = start_leader(port)
    threads = [
        start_worker(port, "127.0.0.2", results),
        start_worker(port, "127.0.0.3", results, delay=4),
    ]
    succeed(leader, threads, ready_within=20)
    assert results == {host: Outcome.success() for host in WORKERS}


def test_workers_first_and_the_leader_last():
    port, results = free_port(), {}
    threads = [start_worker(port, host, results) for host in WORKERS]
    time.sleep(3)
    leader = start_leader(port)
    succeed(leader, threads, ready_within=10)
    assert results == {host: Outcome.success() for host in WORKERS}


def test_worker_gives_up_naming_a_leader_that_never_came():
    port, results = free_port(), {}
    follow(port, "127.0.0.2", results, leader_timeout=1.5)
    assert isinstance(results["127.0.0.2"], PlatformError)
    assert f"the leader 127.0.0.1 never answered on port {port} within 1.5 s" in str(
        results["127.0.0.2"]
    )


def test_a_worker_after_the_leader_gave_up_fails_naming_it():
    port, results = free_port(), {}
    leader = start_leader(port)
    with pytest.raises(
        PlatformError, match="never reported ready within 1 s: 127.0.0.2, 127.0.0.3"
    ):
        leader.wait_ready(timeout=1)
    leader.finish(Outcome.failed(FailureKind.CLUSTER, "workers missing"))
    follow(port, "127.0.0.2", results, leader_timeout=2)
    assert "it has not started, or it has already ended" in str(results["127.0.0.2"])


def test_leader_names_the_workers_that_never_came():
    port, results = free_port(), {}
    leader = start_leader(port, workers=["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    thread = start_worker(port, "127.0.0.3", results)
    with pytest.raises(
        PlatformError, match="never reported ready within 1 s: 127.0.0.2, 127.0.0.4"
    ):
        leader.wait_ready(timeout=1)
    outcome = Outcome.failed(FailureKind.CLUSTER, "workers missing")
    leader.finish(outcome)
    thread.join(timeout=5)
    assert results["127.0.0.3"] == outcome


def test_worker_notices_a_leader_that_vanishes():
    port, results = free_port(), {}
    leader = start_leader(port, workers=["127.0.0.2"])
    thread = start_worker(port, "127.0.0.2", results)
    leader.wait_ready(timeout=10)
    leader.close()  # the leader process dies: no EXIT, sockets closed
    for peer in leader.roster.peers.values():
        peer.connection.close()
    thread.join(timeout=10)
    assert "lost contact with the leader 127.0.0.1" in str(results["127.0.0.2"])


def test_silent_leader_is_detected_by_heartbeat_timeout():
    port = fake_leader(b"KEY k\n")  # hands out a key, then says nothing ever again
    with pytest.raises(
        PlatformError, match="lost contact with the leader 127.0.0.1: silent for 2 s"
    ):
        follow_fake_leader(port, on_key=lambda key: "hostkey")


def test_a_worker_that_goes_silent_before_the_job_starts_is_named():
    port = free_port()
    leader = start_leader(port, workers=["127.0.0.2", "127.0.0.3"])
    with stranger(port, source="127.0.0.2") as fake:  # the real address, but it never pings
        fake.sendall(b"HELLO 127.0.0.2\n")
        with pytest.raises(
            PlatformError, match="worker 127.0.0.2 could not get ready: it went silent for 2 s"
        ):
            leader.wait_ready(timeout=30)
    leader.finish(Outcome.failed(FailureKind.CLUSTER, "lost"))


def test_the_coordinator_listens_on_the_cluster_address_only():
    port = free_port()
    leader = start_leader(port, workers=["127.0.0.2"])
    assert leader.server.getsockname()[0] == LEADER
    leader.finish(Outcome.success())


@pytest.fixture
def hostile_job(monkeypatch):
    """A leader with two workers that arrive after hostile peers had their go; yields the port
    and a function that runs the workers and returns their results."""
    monkeypatch.setattr(coordination, "HELLO_TIMEOUT", 1.0)
    port = free_port()
    leader = start_leader(port)

    def run_job():
        results = {}
        threads = [start_worker(port, host, results) for host in WORKERS]
        succeed(leader, threads, ready_within=20)
        return results

    yield port, run_job
    leader.close()


def test_a_hello_for_a_real_host_from_a_wrong_address_gets_no_key(hostile_job):
    port, run_job = hostile_job
    with stranger(port) as fake:
        fake.sendall(b"HELLO 127.0.0.2\n")
        assert closed_without_a_word(fake)
    assert run_job() == {host: Outcome.success() for host in WORKERS}


def test_a_stranger_naming_no_worker_gets_nothing(hostile_job):
    port, run_job = hostile_job
    with stranger(port, source="127.0.0.2") as fake:
        fake.sendall(b"HELLO intruder\n")
        assert closed_without_a_word(fake)
    with stranger(port) as fake:
        fake.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert closed_without_a_word(fake)
    assert run_job() == {host: Outcome.success() for host in WORKERS}


def test_a_one_megabyte_line_is_cut_off(hostile_job):
    port, run_job = hostile_job
    with stranger(port) as fake:
        try:
            fake.sendall(b"x" * 1_000_000)
        except ConnectionError:
            pass  # the leader closed it while we were still sending: also right
        assert closed_without_a_word(fake)
    assert run_job() == {host: Outcome.success() for host in WORKERS}


def test_a_slowloris_is_cut_off_at_the_handshake_deadline(hostile_job):
    port, run_job = hostile_job
    hello, sent = b"HELLO 127.0.0.2", 0
    with stranger(port) as slow:
        try:
            for byte in hello:  # a byte every 0.3 s: no single recv times out
                slow.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.3)
        except ConnectionError:
            pass
        assert closed_without_a_word(slow)
    # HELLO_TIMEOUT is 1 s here and the whole trickle 4.5 s: the leader hung up part-way.
    assert sent < len(hello)
    assert run_job() == {host: Outcome.success() for host in WORKERS}


def test_a_connection_flood_delays_but_does_not_stop_the_workers(hostile_job):
    port, run_job = hostile_job
    flood = [stranger(port) for _ in range(coordination.MAX_PENDING + 20)]
    try:
        assert run_job() == {host: Outcome.success() for host in WORKERS}
    finally:
        for connection in flood:
            connection.close()


def test_a_second_connection_for_a_ready_host_cannot_take_it_over():
    port, results = free_port(), {}
    leader = start_leader(port, workers=["127.0.0.2"])
    thread = start_worker(port, "127.0.0.2", results)
    leader.wait_ready(timeout=10)
    with stranger(port, source="127.0.0.2") as second:  # even from the right address
        second.sendall(b"HELLO 127.0.0.2\nREADY ssh-ed25519 planted\n")
        assert closed_without_a_word(second)
    assert host_keys(leader) == {"127.0.0.2": "hostkey-of-127.0.0.2-for-ssh-ed25519 AAAA job"}
    leader.finish(FAILED)
    thread.join(timeout=5)
    assert results["127.0.0.2"] == FAILED


def test_a_stranger_is_refused_at_once_while_the_name_service_stalls(monkeypatch):
    """A container joining podman's network stalls its resolver for seconds; the CI run that
    found this waited 10 s for a refusal. Once a worker's address is known, a stranger
    claiming its name is refused without asking the name service again."""
    port, results = free_port(), {}
    leader = start_leader(port, workers=["127.0.0.2"])
    thread = start_worker(port, "127.0.0.2", results)
    leader.wait_ready(timeout=10)
    stalled = threading.Event()
    monkeypatch.setattr(coordination, "address_of", lambda host: stalled.wait(30) and host)
    try:
        with stranger(port) as fake:
            fake.sendall(b"HELLO 127.0.0.2\n")
            assert closed_without_a_word(fake, timeout=3)
    finally:
        stalled.set()
        leader.finish(Outcome.success())
        thread.join(timeout=5)
    assert results["127.0.0.2"] == Outcome.success()


def test_port_in_use_is_a_clear_error():
    with (
        socket.create_server((LEADER, 0)) as taken,
        pytest.raises(PlatformError, match="cannot listen on coordinator port"),
    ):
        Leader(
            address=LEADER,
            port=taken.getsockname()[1],
            workers=["127.0.0.2"],
            public_key="key",
            heartbeat_timeout=2,
        )


def test_unresolvable_hosts_are_named_and_the_leader_marked():
    from container.network import wait_resolvable

    with pytest.raises(
        PlatformError,
        match=r"these host names did not resolve within 1 s: "
        r"algo-1\.invalid \(the leader\), algo-3\.invalid",
    ):
        wait_resolvable(["algo-1.invalid", "localhost", "algo-3.invalid"], "algo-1.invalid", 1)


def test_a_second_ready_on_the_same_connection_changes_nothing(capfd):
    """The leader says when it has read the second READY: only then is "nothing changed"
    a finding (a fixed sleep passed on a slow machine before the leader had read it)."""
    port = free_port()
    leader = start_leader(port, workers=["127.0.0.2"])
    with stranger(port, source="127.0.0.2") as worker:  # a worker speaking the protocol by hand
        worker.sendall(b"HELLO 127.0.0.2\n")
        assert worker.makefile("rb").readline() == b"KEY ssh-ed25519 AAAA job\n"
        worker.sendall(b"READY ssh-ed25519 first\nREADY ssh-ed25519 planted\n")
        assert leader.wait_ready(timeout=5) == {"127.0.0.2": "ssh-ed25519 first"}
        said = []

        def ignored():
            said.append(capfd.readouterr().out)
            return "coordinator: ignored a second READY from 127.0.0.2" in "".join(said)

        eventually(ignored, "the leader never said it ignored the second READY")
        assert host_keys(leader) == {"127.0.0.2": "ssh-ed25519 first"}
    leader.finish(Outcome.success(), timeout=1)


def test_a_worker_lost_while_the_job_runs_is_the_root_cause_of_its_failure():
    """A worker host that vanishes mid-job (its connection closed, as when its container is
    killed) is what the failure file names, not the rank error it caused on the leader."""
    port = free_port()
    leader = start_leader(port, workers=["127.0.0.2"])
    with stranger(port, source="127.0.0.2") as worker:  # speaks the protocol by hand
        worker.sendall(b"HELLO 127.0.0.2\n")
        worker.settimeout(5)
        assert worker.recv(1000).startswith(b"KEY ")
        worker.sendall(b"READY hostkey\n")
        leader.wait_ready(timeout=10)
    rank_error = Outcome.failed(
        FailureKind.RANK,
        "rank 0 on host 127.0.0.1 failed (exit code 1): UnavailableError: Connection reset by peer",
    )
    eventually(
        lambda: leader.root_cause(rank_error) != rank_error,  # the close: at once
        "the closed connection was never noticed",
    )
    assert leader.root_cause(rank_error) == Outcome.failed(
        FailureKind.CLUSTER,
        (
            "lost contact with host 127.0.0.2: it closed the connection (host killed, out of memory "
            "or network down); the job on every host was stopped"
        ),
    )
    assert leader.root_cause(Outcome.success()) == Outcome.success()
    leader.finish(rank_error)


def test_a_worker_that_cannot_get_ready_is_named_with_its_whole_reason():
    """sshd's configuration check prints several lines: all of them reach the job's failure
    (the leader once read the first line of FAIL and dropped the rest)."""
    port, results = free_port(), {}

    def broken_sshd(key):
        raise PlatformError("sshd rejected its configuration: line 3: bad\nline 9: worse")

    thread = start_worker(port, "127.0.0.2", results, on_key=broken_sshd)
    leader = start_leader(port, workers=["127.0.0.2"])
    with pytest.raises(PlatformError) as raised:
        leader.wait_ready(timeout=10)
    assert str(raised.value) == (
        "worker 127.0.0.2 could not get ready: sshd rejected its configuration: "
        "line 3: bad line 9: worse"
    )
    assert raised.value.exit_code == 3  # the cluster's failure, as the worker's own
    leader.finish(Outcome.failed(FailureKind.CLUSTER, str(raised.value)))
    thread.join(timeout=5)
    assert "sshd rejected its configuration" in str(results["127.0.0.2"])


def test_a_worker_that_cannot_get_ready_by_the_users_error_fails_the_job_with_its_code():
    """A port held on a worker is the user's to move (container.ports.check, ConfigError): the
    leader fails the job with a ConfigError too, and the worker that was ready is told exit 2,
    as the failing worker exits; the leader once made every FAIL the cluster's (3)."""
    port, results = free_port(), {}
    held = "port 22 on 127.0.0.2, where the job's own sshd would listen, is held"

    def port_held(key):
        raise ConfigError(held)

    leader = start_leader(port)
    ready = start_worker(port, "127.0.0.3", results)
    eventually(lambda: "127.0.0.3" in host_keys(leader), "127.0.0.3 never got ready")
    failing = start_worker(port, "127.0.0.2", results, on_key=port_held)
    with pytest.raises(ConfigError) as raised:
        leader.wait_ready(timeout=10)
    assert str(raised.value) == f"worker 127.0.0.2 could not get ready: {held}"
    assert raised.value.exit_code == 2
    leader.finish(Outcome.failed(raised.value.kind, str(raised.value)))  # as run_leader does
    for thread in (ready, failing):
        thread.join(timeout=5)
    assert results["127.0.0.3"] == Outcome.failed(FailureKind.CONFIG, str(raised.value))
    assert results["127.0.0.3"].exit_code == 2
    assert isinstance(results["127.0.0.2"], ConfigError) and str(results["127.0.0.2"]) == held


def test_a_worker_names_a_leader_that_answers_hello_with_something_else():
    """The first answer is the job's key or its outcome; anything else is named, not taken
    for a key and handed to sshd."""
    port, keys = fake_leader(b"READY what\n"), []
    with pytest.raises(
        PlatformError, match="the leader 127.0.0.1 sent 'READY what' instead of the job's key"
    ):
        follow_fake_leader(port, on_key=keys.append)
    assert keys == []


LIMIT = 3 * 2**30


def test_the_leader_learns_what_a_workers_memory_cgroup_counted_when_it_asks():
    """A rank killed by SIGKILL on a worker's host: the leader asks that worker's launcher,
    which reads its own cgroup then (not before: each question gets a fresh reading), and the
    failure's reason names the kills counted since the attempt started (the leader asked at
    its start) for certain; a worker that cannot read its cgroup, a host that is no worker, or
    one whose start is unknown, leaves it unknown at once."""
    port, results, reads = free_port(), {}, []

    def counted():
        reads.append(1)
        return CgroupMemory(len(reads), LIMIT)

    leader = start_leader(port)
    threads = [
        start_worker(port, "127.0.0.2", results, memory=counted),
        start_worker(port, "127.0.0.3", results, memory=lambda: None),
    ]
    leader.wait_ready(timeout=10)
    assert leader.memory_of("127.0.0.2") is None  # no attempt started: not asked
    assert reads == []  # read when asked only
    leader.start_attempt()
    assert reads == [1]  # its start: 1 kill, before this attempt
    assert leader.memory_of("127.0.0.2") == CgroupMemory(1, LIMIT)  # 2 since the start: 1
    assert leader.memory_of("127.0.0.2") == CgroupMemory(2, LIMIT)
    started = time.monotonic()
    assert leader.memory_of("127.0.0.3") is None  # it answered that it cannot read it
    assert leader.memory_of("127.0.0.1") is None  # the leader's own: not asked over the wire
    assert time.monotonic() - started < 1.0
    log = OutputLog()
    log.add(
        "mpirun noticed that process rank 1 with PID 0 on node 127.0.0.2 exited on signal 9 "
        "(Killed)."
    )
    hosts = ["127.0.0.1", "127.0.0.2"]
    outcome = summarize(log, 137, hosts.__getitem__, lambda: None, leader.memory_of)
    assert outcome.reason == (
        "rank 1 on host 127.0.0.2 was killed by signal 9 (Killed) - "
        f"{killed(CgroupMemory(3, LIMIT), '127.0.0.2')}"
    )
    leader.finish(outcome)  # the workers, asked on the way, still get the outcome
    for thread in threads:
        thread.join(timeout=5)
    assert results["127.0.0.2"] == outcome and results["127.0.0.3"] == outcome


def test_a_worker_that_does_not_answer_holds_the_job_at_most_the_memory_timeout():
    """The question never hangs the job's end: no answer is an unknown after `timeout`; an
    answer counts only once asked, and a closed connection is an unknown at once."""
    port = free_port()
    leader = start_leader(port, workers=["127.0.0.2"], heartbeat_timeout=10)
    worker = stranger(port, source="127.0.0.2")  # speaks the protocol by hand
    with worker, worker.makefile("rb") as lines:  # both closed: the leader sees the close
        worker.sendall(b"HELLO 127.0.0.2\n")
        assert lines.readline().startswith(b"KEY ")
        worker.sendall(b"READY hostkey\n")
        leader.wait_ready(timeout=5)
        threading.Timer(0.2, worker.sendall, args=(b"OOM_KILLS 0 -\n",)).start()
        leader.start_attempt()
        assert next(line for line in lines if line != b"PING\n") == b"MEMORY\n"
        started = time.monotonic()
        assert leader.memory_of("127.0.0.2", timeout=0.5) is None
        assert 0.5 <= time.monotonic() - started < 1.5
        assert next(line for line in lines if line != b"PING\n") == b"MEMORY\n"
        worker.sendall(b"OOM_KILLS 2 -\n")  # too late: the question has had its answer, None
        eventually(
            lambda: leader.roster.peers["127.0.0.2"].memory_answers == 2,
            "the late answer was never read",
        )
        threading.Timer(0.2, worker.sendall, args=(b"OOM_KILLS 3 -\n",)).start()
        assert leader.memory_of("127.0.0.2", timeout=5) == CgroupMemory(3, None)  # not 2
    started = time.monotonic()
    eventually(
        lambda: leader.roster.peers["127.0.0.2"].connection.closed.is_set(),
        "the closed connection was never noticed",
    )
    assert leader.memory_of("127.0.0.2", timeout=5) is None  # lost: not asked
    assert time.monotonic() - started < 1.0
    leader.finish(Outcome.success(), timeout=1)


def test_a_workers_oom_kill_in_an_earlier_attempt_leaves_a_later_sigkill_likely():
    """max_restarts: attempt 1's rank on the worker was killed by the OOM killer, attempt 2's
    by someone else's `kill -9`. The worker's cgroup still counts attempt 1's kill, but the
    leader asked it as attempt 2 started, so attempt 2's reason is "likely", not certain; a
    worker that did not answer at the start leaves it unknown (its count may hold old kills)."""
    port, results, kernel = free_port(), {}, [0]  # the OOM kills the worker's cgroup counted
    leader = start_leader(port)
    threads = [
        start_worker(port, "127.0.0.2", results, memory=lambda: CgroupMemory(kernel[0], LIMIT)),
        start_worker(port, "127.0.0.3", results, memory=lambda: None),
    ]
    leader.wait_ready(timeout=10)
    log = OutputLog()
    log.add(
        "mpirun noticed that process rank 1 with PID 0 on node 127.0.0.2 exited on signal 9 "
        "(Killed)."
    )
    hosts, second = ["127.0.0.1", "127.0.0.2"], FAILED
    try:  # the workers end only when told: a failed assertion must not leave them waiting
        leader.start_attempt()  # attempt 1
        kernel[0] += 1  # the OOM killer kills rank 1
        first = summarize(log, 137, hosts.__getitem__, lambda: None, leader.memory_of)
        assert first.reason.endswith(killed(CgroupMemory(1, LIMIT), "127.0.0.2"))
        leader.start_attempt()  # attempt 2: rank 1 is killed again, by `kill -9`
        second = summarize(log, 137, hosts.__getitem__, lambda: None, leader.memory_of)
        assert second.reason == (
            "rank 1 on host 127.0.0.2 was killed by signal 9 (Killed) - likely out of memory"
        )
        assert leader.memory_of("127.0.0.3") is None
    finally:
        leader.finish(second)
        for thread in threads:
            thread.join(timeout=5)
    assert results["127.0.0.2"] == second
