"""The leader/worker protocol over real TCP sockets on loopback."""

import socket
import threading
import time

import pytest

from container.coordination import Leader, follow_leader
from container.errors import PlatformError
from container.network import free_port


def follow(port, host, results, **overrides):
    options = dict(leader_timeout=10, heartbeat_timeout=5, on_key=lambda key: f"hostkey-of-{host}-for-{key}")
    options.update(overrides)
    try:
        results[host] = follow_leader("127.0.0.1", port, host, **options)
    except PlatformError as error:
        results[host] = error


def test_workers_get_the_key_and_the_outcome():
    port, results = free_port(), {}
    leader = Leader(port, ["algo-2", "algo-3"], "ssh-ed25519 AAAA job")
    threads = [threading.Thread(target=follow, args=(port, h, results)) for h in ("algo-2", "algo-3")]
    for thread in threads:
        thread.start()
    keys = leader.wait_ready(timeout=10)
    assert keys == {h: f"hostkey-of-{h}-for-ssh-ed25519 AAAA job" for h in ("algo-2", "algo-3")}
    time.sleep(1.5)  # heartbeats flow meanwhile; the workers must keep waiting
    assert all(t.is_alive() for t in threads)
    leader.finish(3, "rank 1 on host algo-2 failed")
    for thread in threads:
        thread.join(timeout=5)
    assert results == {h: (3, "rank 1 on host algo-2 failed") for h in ("algo-2", "algo-3")}


def test_worker_gives_up_naming_a_leader_that_never_came():
    port, results = free_port(), {}
    started = time.monotonic()
    follow(port, "algo-2", results, leader_timeout=1.5)
    assert isinstance(results["algo-2"], PlatformError)
    assert f"the leader 127.0.0.1 never answered on port {port} within 1.5 s" in str(results["algo-2"])
    assert time.monotonic() - started < 10


def test_leader_names_the_workers_that_never_came():
    port, results = free_port(), {}
    leader = Leader(port, ["algo-2", "algo-3", "algo-4"], "key")
    thread = threading.Thread(target=follow, args=(port, "algo-3", results))
    thread.start()
    with pytest.raises(PlatformError, match="never reported ready within 1 s: algo-2, algo-4"):
        leader.wait_ready(timeout=1)
    leader.finish(3, "workers missing")
    thread.join(timeout=5)
    assert results["algo-3"] == (3, "workers missing")


def test_worker_notices_a_leader_that_vanishes():
    port, results = free_port(), {}
    leader = Leader(port, ["algo-2"], "key")
    thread = threading.Thread(target=follow, args=(port, "algo-2", results))
    thread.start()
    leader.wait_ready(timeout=10)
    leader.finished.set()  # the leader process dies: no EXIT, sockets closed
    for connection in leader.connections.values():
        connection.shutdown(socket.SHUT_RDWR)
        connection.close()
    leader.server.close()
    thread.join(timeout=10)
    assert "lost contact with the leader 127.0.0.1" in str(results["algo-2"])


def test_silent_leader_is_detected_by_heartbeat_timeout():
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))
    accepted = []

    def silent():  # accepts, hands out a key, then says nothing ever again
        connection, _ = server.accept()
        accepted.append(connection)
        connection.recv(100)
        connection.sendall(b"KEY k\n")

    threading.Thread(target=silent, daemon=True).start()
    with pytest.raises(PlatformError, match="lost contact with the leader 127.0.0.1: silent for 2 s"):
        follow_leader("127.0.0.1", port, "algo-2", leader_timeout=5, heartbeat_timeout=2,
                      on_key=lambda key: "hostkey")
    server.close()


def test_a_stranger_is_turned_away():
    port, results = free_port(), {}
    leader = Leader(port, ["algo-2"], "key")
    follow(port, "intruder", results)
    assert results["intruder"] == (1, "'intruder' is not a worker of this job")
    leader.finish(0, "")


def test_port_in_use_is_a_clear_error():
    with socket.create_server(("", 0)) as taken:
        with pytest.raises(PlatformError, match="cannot listen on coordinator port"):
            Leader(taken.getsockname()[1], ["algo-2"], "key")


def test_unresolvable_hosts_are_named_and_the_leader_marked():
    from container.network import wait_resolvable

    with pytest.raises(PlatformError, match=r"these host names did not resolve within 1 s: "
                                            r"algo-1\.invalid \(the leader\), algo-3\.invalid"):
        wait_resolvable(["algo-1.invalid", "localhost", "algo-3.invalid"], "algo-1.invalid", 1)
