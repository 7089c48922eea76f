"""The ports a job listens on, made sure of on each host before the job starts them.

Some of them are bound by the ranks, not by the launcher: JAX's coordinator (process 0,
`distribution_port`) and, under MultiWorkerMirroredStrategy, each TensorFlow worker's gRPC
server (`tf_worker_port` and up); on a data host, the tf.data service (`data_service_port`).
JAX's gRPC server listens with SO_REUSEPORT, so a second job on the same host whose process 0
binds the same port does not fail to start: both listen, the kernel deals each new connection
to either, and one job's process registers with the other job's coordinator, which then aborts
its own processes ("0 unexpectedly tried to connect with a different incarnation"). Something
else on a port (a plain listener) makes the server's start fail instead ("Failed to start RPC
server"), or, for a worker's sshd, leaves the leader waiting for an sshd that never answers.
Either way, only the host itself can tell, and only before the job's processes start, so each
host checks here the ports that it listens on (container.plan.host_ports says which):

- A port only the leader's own processes connect to (a job whose ranks run on one host) is
  taken fresh from the kernel every time (`secure`), not the configured one checked: a
  configured port checked free would still be the one that another job started at the same
  moment is about to bind (its ranks are still importing), which is how two GPU checks at
  once collided.
- A port other hosts were told (the same hyperparameters reach every host) cannot change:
  when something else holds it, the host stops (`check`: ConfigError, exit 2) naming the port,
  what the job would listen on there and the hyperparameter that moves it. The leader checks
  before its coordinator starts; a worker or a data host when the leader hands it the job's
  key, before its sshd or data service starts, so that the error goes to the leader as that
  host's answer (FAIL, container.coordination) and the job's failure names it. SageMaker gives
  each job instances of its own, so the defaults are free there; this is for hosts that run
  more (a local cluster, several hosts on one machine).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import socket
from collections.abc import Iterator
from typing import Any

from container.logs import log
from container.plan import JobPort, LaunchPlan, host_ports
from job.errors import ConfigError
from job.launch_config import LaunchConfig

# A run of free ports in a row (several workers of one host) is looked for this many times.
ATTEMPTS = 50


def _listener(address: str | None = None) -> socket.socket:
    """A TCP socket for `address`, or (None) for every address of this host, IPv6 and IPv4, as
    JAX's and TensorFlow's gRPC servers bind (`[::]:port`); IPv4 alone where the host has no
    IPv6. SO_REUSEADDR, as gRPC's and sshd's: the TIME_WAIT of a finished job's connection does
    not hold a port. No SO_REUSEPORT: a gRPC server already listening there (with it) then
    holds the port for this socket."""
    if address is not None:
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    else:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        except OSError:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def _bind(sock: socket.socket, port: int, address: str | None = None) -> bool:
    """Binds `sock` to `port` on `address` (None: every address); False when something holds
    the port there."""
    if address is None:
        address = "::" if sock.family == socket.AF_INET6 else ""
    try:
        sock.bind((address, port))
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            return False
        raise
    return True


def is_free(port: int, address: str | None = None) -> bool:
    """Whether nothing holds `port` on `address` now (None: on any address of this host; a
    listener on every address holds the port on each address too). A port this user may not
    bind (below 1024, not root) counts as free: whatever of the job binds it says why."""
    with _listener(address) as sock:
        try:
            return _bind(sock, port, address)
        except PermissionError:
            return True


@contextlib.contextmanager
def _held() -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    try:
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def _free_run(count: int, held: list[socket.socket]) -> int:
    """The first of `count` free ports in a row, held (in `held`) until the caller is done, so
    that the runs it asks for next are other ports."""
    for _ in range(ATTEMPTS):
        first = _listener()
        held.append(first)
        _bind(first, 0)  # the kernel's choice: a port nothing holds
        start: int = first.getsockname()[1]
        for port in range(start + 1, start + count):
            sock = _listener()
            held.append(sock)
            if port > 65535 or not _bind(sock, port):
                break
        else:
            return start
    raise ConfigError(
        f"this host has no {count} free ports in a row for the job's processes "
        f"({ATTEMPTS} tries); set processes_per_host lower"
    )


def describe(port: JobPort) -> str:
    """'tf_worker_port 41000-41001 (this host's MultiWorkerMirroredStrategy workers)'"""
    last = f"-{port.port + port.count - 1}" if port.count > 1 else ""
    return f"{port.setting} {port.port}{last} ({port.listener})"


def check(plan: LaunchPlan, address: str) -> None:
    """ConfigError naming the first of this host's fixed ports (the hyperparameters' ports,
    which every host was given) that something else holds now; `address` is this host's
    cluster address, where its sshd and coordinator listen."""
    host = plan.cluster.current_host
    for port in host_ports(plan):
        if port.movable:
            continue
        where = address if port.own_address else None
        taken = next(
            (p for p in range(port.port, port.port + port.count) if not is_free(p, where)), None
        )
        if taken is not None:
            raise ConfigError(
                f"port {taken} on {host}, where {port.listener} would "
                f"listen, is held by another process on this host (another job?); set the "
                f"hyperparameter {port.setting} to a port that is free on "
                f"{host} (every host is given the same value)"
            )


def secure(plan: LaunchPlan) -> LaunchConfig:
    """The launch settings a job whose ranks run on one host runs with: the ports only its own
    processes connect to replaced by free ones this host's kernel gave (logged). `plan.launch`
    itself when nothing moves (on every host of a job of several: their ports are `check`ed)."""
    movable = [port for port in host_ports(plan) if port.movable]
    if not movable:
        return plan.launch
    with _held() as held:
        moved = [dataclasses.replace(p, port=_free_run(p.count, held)) for p in movable]
    log.info(
        "one host: only its own processes connect to "
        + " and ".join(describe(port) for port in moved)
        + ", free ports taken now; the hyperparameters set these ports for jobs of several hosts"
    )
    ports_of: dict[str, Any] = {port.setting: port.port for port in moved}
    return dataclasses.replace(plan.launch, **ports_of)
