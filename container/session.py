"""A process the launcher starts, in a session of its own, and ended with everything it started.

mpirun on the leader and the program of a data host each run in a new session
(start_new_session, which is also a process group of their own). What they start stays in
that session: a script's multiprocessing.Pool or helper process, and mpirun's ranks (Open MPI
gives each rank a process group of its own, but inside mpirun's session) with whatever those
start. So:

- ending the program ends the whole session, not one pid: SIGTERM to every process group in
  it, SIGKILL to whatever is left `KILL_AFTER` seconds later (torchrun's SubprocessHandler
  ends its worker's process group the same way);
- whatever the program leaves behind when it exits on its own is ended the same way, with a
  line in the log naming it;
- its output is read until the pipe closes or nothing of the session is left, whichever comes
  first: a process that left the session (setsid, as a daemon does) may hold the pipe open
  for ever, and once the session is empty nothing of the job writes to it any more.

A process that makes a session of its own escapes this, as it escapes any process group; on
SageMaker the container's end takes it (the launcher's exit ends PID 1, container.init, and
the kernel then kills every process of the container).
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, cast

from container.logs import log

KILL_AFTER = 10.0  # seconds between SIGTERM to a session and SIGKILL to what is left of it
POLL = 0.2
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def living_processes() -> dict[int, tuple[int, int, int]]:
    """Every living process: pid -> (parent, process group, session). Zombies are left out:
    they are dead, only their parent's wait is missing."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:  # it ended while we looked
            continue
        if fields[0] != b"Z":
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def session_members(session: int) -> dict[int, int]:
    """The living processes of `session`: pid -> process group."""
    return {pid: group for pid, (_, group, sid) in living_processes().items() if sid == session}


def descendants(ancestor: int) -> dict[int, int]:
    """The living processes below `ancestor`, whatever their session: pid -> process group."""
    table = living_processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, list(children.get(ancestor, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return found


def adopt_orphans() -> bool:
    """Make this process a child subreaper (prctl PR_SET_CHILD_SUBREAPER): a process orphaned
    below it becomes its child, not init's, so it stays among its descendants. A worker's
    ranks run under its sshd's sessions, each a session of its own (sshd's setsid); a helper a
    rank left there outlives the MPI daemon that started the rank, then is found here."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        return True
    log.info(
        f"cannot adopt orphaned processes (prctl: "
        f"{os.strerror(ctypes.get_errno())}); what the ranks leave on this host is ended "
        "with the container"
    )
    return False


def end_descendants(what: str, why: str) -> None:
    """End every process below this one (end_processes) and reap them: once adopted
    (adopt_orphans) they are this process's children, whose exit status nobody else waits
    for. Only where nothing else waits for a child of this process."""
    end_processes(lambda: descendants(os.getpid()), what, why)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def end_processes(
    find: Callable[[], dict[int, int]], what: str, why: str, kill_after: float = KILL_AFTER
) -> None:
    """SIGTERM to the process groups of the processes `find` returns (pid -> group), SIGKILL
    to those still found `kill_after` s later; returns once `find` finds none."""
    found = find()
    if not found:
        return
    log.info(f"{why}; ending {what} ({len(found)}: pids {', '.join(map(str, sorted(found)))})")
    _signal(found, signal.SIGTERM)
    deadline = time.monotonic() + kill_after
    while (found := find()) and time.monotonic() < deadline:
        time.sleep(POLL)
    if not found:
        return
    log.info(
        f"{len(found)} of them still running {kill_after:g} s after SIGTERM (pids "
        f"{', '.join(map(str, sorted(found)))}); killing them"
    )
    deadline = time.monotonic() + KILL_AFTER
    while (found := find()) and time.monotonic() < deadline:  # forks made meanwhile too
        _signal(found, signal.SIGKILL)
        time.sleep(POLL / 4)
    if found:  # in the kernel's uninterruptible sleep (a dead mount's read)
        log.info(
            f"pids {', '.join(map(str, sorted(found)))} survive SIGKILL (stuck in "
            "the kernel); leaving them"
        )


def _signal(processes: dict[int, int], sig: int) -> None:
    """`sig` to the processes' groups (what they fork meanwhile is in them too), but to the
    process alone where its group is the launcher's own."""
    own = os.getpgrp()
    for target in {-group if group != own else pid for pid, group in processes.items()}:
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            pass


class Session:
    """`argv` run in a new session, its stdout and stderr one pipe of text lines."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            bufsize=1,
            errors="replace",
            start_new_session=True,
        )
        self.name = os.path.basename(argv[0])
        self._ending = threading.Lock()

    @property
    def id(self) -> int:
        return self.process.pid  # the session's leader: its id is the session's

    def members(self) -> dict[int, int]:
        return session_members(self.id)

    def signal_program(self, sig: int) -> None:
        """`sig` to the program alone (mpirun forwards SIGUSR1 and SIGUSR2 to every rank)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def output(self) -> Iterator[str]:
        """The pipe's lines, until it closes or nothing of the session is left. What the
        program leaves behind when it exits on its own is ended (SIGTERM, then SIGKILL)."""
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            for line in cast(IO[str], self.process.stdout):  # stdout=PIPE: never None
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True, name=f"{self.name} output").start()
        left_behind = False
        while (line := self._next(lines)) is not None:
            if line:
                yield line
                continue
            if self.process.poll() is None:
                continue
            if left_behind or not self.members():
                return  # the pipe is held by a process outside the session
            left_behind = True
            self._end_left_behind()
        self.process.wait()
        self._end_left_behind()

    @staticmethod
    def _next(lines: queue.Queue[str | None]) -> str | None:
        """The next line, "" when none came for a while, None at the pipe's end."""
        try:
            return lines.get(timeout=POLL)
        except queue.Empty:
            return ""

    def _end_left_behind(self) -> None:
        if self.members():
            self.end(
                f"{self.name} exited (code {self.process.returncode}) and left processes running"
            )

    def end(self, why: str, kill_after: float = KILL_AFTER) -> None:
        """End every process of the session (end_processes); one caller at a time (the stop's
        deadline, the watchdog and an abort may each end it)."""
        with self._ending:
            end_processes(
                self.members, f"{self.name} and every process it started", why, kill_after
            )
