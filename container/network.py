"""Waiting for the cluster's hosts: name resolution and sshd, each with a deadline; ports.

SageMaker's host names (algo-1, algo-2, ...) may not resolve the instant a container starts,
so every host retries until a deadline. A timeout names exactly the hosts that never answered,
which is the line a user needs instead of "Cannot connect to host algo-1" in a hang.
Polling backs off from 0.1 s to 1 s: quick when things are quick, cheap when they are not.
`free_port` and `free_ports` find ports for the servers that tests and benchmarks start on loopback.

The interface OpenMPI is told to use comes from resourceconfig.json, and it is not always
there: SageMaker's local mode writes `ethwe`, and some instance types name theirs otherwise.
`interface_for` then picks the interface that carries the host's cluster address.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import time
from collections.abc import Callable, Iterable, Mapping

from job.errors import PlatformError


def poll_until(
    check: Callable[[str], bool],
    items: Iterable[str],
    timeout: float,
    what: str,
    name: Callable[[str], str] = str,
) -> None:
    """Call `check(item)` for every item until all pass; PlatformError naming the rest."""
    pending = list(items)
    deadline = time.monotonic() + timeout
    delay = 0.1
    while pending:
        pending = [item for item in pending if not check(item)]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise PlatformError(f"{what} within {timeout:g} s: {', '.join(map(name, pending))}")
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 1.0)


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except OSError:
        return False


def address_of(host: str) -> str:
    """The IPv4 address a host name resolves to (sshd binds to it)."""
    address = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    return str(address)  # an IPv4 sockaddr's host is a str (typeshed: str | int)


def ssh_banner(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when an SSH server answers on host:port (it speaks first: 'SSH-2.0-...')."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            connection.settimeout(timeout)
            answered = connection.recv(4).startswith(b"SSH-")
            connection.sendall(b"SSH-2.0-readiness-probe\r\n")  # a polite goodbye: no sshd error
            return answered
    except OSError:
        return False


def wait_resolvable(hosts: Iterable[str], leader: str, timeout: float) -> None:
    poll_until(
        resolves,
        hosts,
        timeout,
        "these host names did not resolve",
        lambda host: f"{host} (the leader)" if host == leader else host,
    )


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now (the kernel's pick)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different TCP ports free on 127.0.0.1 now. Every probe stays bound until all are
    picked: probes closed one by one may get the same port twice (a job's sshd and coordinator
    on one port: sshd cannot bind, and its readiness probes reach the coordinator)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def wait_sshd(hosts: Iterable[str], port: int, timeout: float) -> None:
    poll_until(
        lambda host: ssh_banner(host, port),
        hosts,
        timeout,
        f"sshd did not answer on port {port} of these hosts",
    )


def interface_for(
    named: str, address: str, interfaces: Mapping[str, ipaddress.IPv4Interface]
) -> str | None:
    """`named` when this host has it; else the interface whose address is `address`, else
    the one whose network holds it (127.0.0.2 is on lo's 127.0.0.0/8); None when none does."""
    if named in interfaces:
        return named
    ip = ipaddress.IPv4Address(address)
    exact = [name for name, interface in interfaces.items() if interface.ip == ip]
    holding = [name for name, interface in interfaces.items() if ip in interface.network]
    return next(iter(exact + holding), None)


_SIOCGIFADDR, _SIOCGIFNETMASK = 0x8915, 0x891B


def local_interfaces() -> dict[str, ipaddress.IPv4Interface]:
    """This host's interfaces that have an IPv4 address, with their networks."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                address = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)[20:24]
                netmask = fcntl.ioctl(probe.fileno(), _SIOCGIFNETMASK, request)[20:24]
            except OSError:  # no IPv4 address on this one
                continue
            found[name] = ipaddress.IPv4Interface(
                f"{socket.inet_ntoa(address)}/{socket.inet_ntoa(netmask)}"
            )
    return found
