"""What a rank's pulse tells of a main thread that wants no CPU (train.activity.io_wait): real
threads blocked in a slow HTTP call to a loopback server, a socket read, a lock, a pipe; and
which threads of JAX's distributed runtime it leaves out (train.activity.exclude_jax_threads)."""

import http.server
import os
import socket
import threading
import time
import types
import urllib.request

import pytest

from tests.waiting import eventually
from train.activity import Pulse, exclude_jax_threads, io_wait


@pytest.fixture
def slow_server():
    """An HTTP server on loopback that answers after `release` is set."""
    release = threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            release.wait(30)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/", release
    release.set()
    server.shutdown()
    server.server_close()


def blocked(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    eventually(lambda: thread.native_id is not None, "the thread never started")
    return thread


def in_syscall(thread: threading.Thread) -> bool:
    """Whether the kernel shows `thread` blocked in a system call (not running, not in none)."""
    with open(f"/proc/self/task/{thread.native_id}/syscall") as status:
        return status.read().split()[0] not in ("running", "-1")


@pytest.mark.parametrize("timeout", [30, None])  # poll() then recv, or a blocking recv
def test_a_thread_in_a_slow_http_call_waits_on_the_network(slow_server, timeout):
    url, release = slow_server
    thread = blocked(lambda: urllib.request.urlopen(url, timeout=timeout).read())
    eventually(
        lambda: io_wait(thread.native_id) == "network",
        f"never seen waiting on the network: {io_wait(thread.native_id)}",
    )
    release.set()
    thread.join(10)
    assert io_wait(thread.native_id) is None  # ended


def test_a_thread_on_a_lock_a_pipe_or_asleep_waits_on_no_io(tmp_path):
    """What a hang looks like (a deadlock, a peer that never writes, a sleep): none is I/O.
    Each is seen blocked in its system call (the kernel names it) before it is judged."""
    lock, (reader, writer) = threading.Lock(), os.pipe()
    lock.acquire()
    threads = [
        blocked(lock.acquire),
        blocked(lambda: os.read(reader, 1)),
        blocked(lambda: time.sleep(30)),
    ]
    for thread in threads:
        eventually(lambda thread=thread: in_syscall(thread), "never blocked")
        assert io_wait(thread.native_id) is None
    lock.release()
    os.write(writer, b"x")


def test_a_tcp_read_is_network_and_a_local_socket_is_not():
    """A Unix socket is another process of this host (a loader that may never answer), as a
    pipe is; a TCP connection, even on loopback, is the network."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    left, right = socket.socketpair()
    tcp, local = blocked(lambda: client.recv(1)), blocked(lambda: left.recv(1))
    eventually(lambda: io_wait(tcp.native_id) == "network", "never seen on the TCP socket")
    eventually(lambda: in_syscall(local), "never blocked")
    assert io_wait(local.native_id) is None
    server.send(b"x")
    right.send(b"x")
    for thread in (tcp, local):
        thread.join(10)
    assert io_wait(threading.main_thread().native_id) is None  # running this test
    for each in (listener, client, server, left, right):
        each.close()


def started_thread(threads: list[threading.Thread], release: threading.Event) -> None:
    """Start a thread that waits for `release`, as a native library's does, into `threads`."""
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    threads.append(thread)


def fake_jax(threads: dict[str, list[threading.Thread]], release: threading.Event):
    """A stand-in for `jax` where each call starts a thread: jax.distributed.initialize (the
    coordination service's), the Gloo collectives' factory in JAX's private native module and
    the CPU client's factory (its compute pools)."""

    def starting(name):
        threads[name] = []
        return lambda *args, **kwargs: started_thread(threads[name], release)

    native = types.SimpleNamespace(
        make_gloo_tcp_collectives=starting("gloo"), make_cpu_client=starting("client")
    )
    return types.SimpleNamespace(
        distributed=types.SimpleNamespace(initialize=starting("initialize")),
        _src=types.SimpleNamespace(lib=types.SimpleNamespace(_jax=native)),
    )


def test_jax_runtime_threads_are_left_out_of_the_pulse_and_its_compute_threads_are_not(
    monkeypatch,
):
    """The threads that jax.distributed.initialize and the Gloo collectives start are left out
    (they wake every few milliseconds whatever the process does); those the CPU client starts
    (XLA computes on them) still count. Installing twice wraps once."""
    monkeypatch.setattr(Pulse, "excluded", set())
    threads, release = {}, threading.Event()
    jax = fake_jax(threads, release)
    exclude_jax_threads(jax)
    initialize, gloo = jax.distributed.initialize, jax._src.lib._jax.make_gloo_tcp_collectives
    exclude_jax_threads(jax)
    assert jax.distributed.initialize is initialize
    assert jax._src.lib._jax.make_gloo_tcp_collectives is gloo
    try:
        jax.distributed.initialize("localhost:1234", 2, 0)
        jax._src.lib._jax.make_gloo_tcp_collectives(distributed_client=None)
        jax._src.lib._jax.make_cpu_client()
        ids = {name: {thread.native_id for thread in started} for name, started in threads.items()}
        assert Pulse.excluded == ids["initialize"] | ids["gloo"]
        counted = set(Pulse.demand())
        assert ids["client"] <= counted and not counted & Pulse.excluded
    finally:
        release.set()


def test_a_jax_without_the_gloo_factory_still_leaves_out_the_coordination_threads(monkeypatch):
    monkeypatch.setattr(Pulse, "excluded", set())
    threads, release = {}, threading.Event()
    jax = fake_jax(threads, release)
    del jax._src
    exclude_jax_threads(jax)
    try:
        jax.distributed.initialize()
        assert Pulse.excluded == {thread.native_id for thread in threads["initialize"]}
    finally:
        release.set()
