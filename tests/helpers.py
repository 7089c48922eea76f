"""Helpers that tests of several folders share (not a test module itself)."""

from __future__ import annotations

from container.network import free_ports


def loopback_hyperparameters(
    *, timeout: int = 60, more_ports: tuple[str, ...] = ()
) -> dict[str, int]:
    """The hyperparameters of a job whose hosts are loopback addresses of this one machine.

    Its hosts share the machine's ports, where SageMaker's each have their own: sshd, the
    coordinator and each port hyperparameter named in `more_ports` get different free ports.
    The timeouts are a test's: a host or leader that never comes fails the job within
    `timeout` seconds (the launcher's defaults wait 10 and 15 minutes), a silent one within
    10 s (30 by default).
    """
    names = ("sshd_port", "coordinator_port", *more_ports)
    return {
        **dict(zip(names, free_ports(len(names)))),
        "host_timeout": timeout,
        "leader_timeout": timeout,
        "heartbeat_timeout": 10,
    }
