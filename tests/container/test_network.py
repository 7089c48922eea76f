"""Which interface OpenMPI is told to use when resourceconfig.json names one the host lacks;
the free ports tests and benchmarks give a job's servers."""

import socket
from contextlib import ExitStack
from ipaddress import IPv4Interface

from container.network import free_ports, interface_for, local_interfaces

HOST = {
    "lo": IPv4Interface("127.0.0.1/8"),
    "eth0": IPv4Interface("172.18.0.3/16"),
    "eth1": IPv4Interface("10.0.0.7/24"),
}


def test_the_named_interface_when_the_host_has_it():
    assert interface_for("eth1", "172.18.0.3", HOST) == "eth1"


def test_else_the_one_whose_address_is_the_hosts():
    assert interface_for("ethwe", "172.18.0.3", HOST) == "eth0"


def test_else_the_one_whose_network_holds_it():
    assert interface_for("ethwe", "10.0.0.200", HOST) == "eth1"
    assert interface_for("ens5", "127.0.0.2", HOST) == "lo"


def test_none_when_no_interface_carries_it():
    assert interface_for("ethwe", "192.168.1.1", HOST) is None


def test_this_machine_has_loopback_with_its_network():
    assert local_interfaces()["lo"] == IPv4Interface("127.0.0.1/8")


def test_free_ports_are_different_and_each_can_be_bound_at_once():
    for _ in range(200):  # one probe at a time gave one port twice in 1 of 5,000 pairs here
        ports = free_ports(3)
        assert len(set(ports)) == 3, ports
    with ExitStack() as stack:
        for port in ports:
            stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
