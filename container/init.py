"""Acting as PID 1 of a container, which is where SageMaker's `docker run IMAGE train` puts us.

PID 1 inherits every orphan: OpenMPI's orted daemonizes, sshd forks per connection, and each
ends as a zombie unless PID 1 reaps it. The kernel also drops default-action signals sent to
PID 1. So when the launcher finds itself PID 1 it forks: the child runs the launcher as
usual, the parent stays a tiny init that forwards signals to it and reaps every exited
process until the child ends, then exits with the child's status.
"""

from __future__ import annotations

import os
import signal

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def become_init() -> None:
    """Returns in the child (which goes on to launch); the parent never returns."""
    if os.getpid() != 1:
        return
    child = os.fork()
    if child == 0:
        return
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: os.kill(child, signum))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)
