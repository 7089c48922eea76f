"""A rank's pulse: whether it is computing, for the launcher's watchdog (container/watchdog.py).

Steps and printed lines show that a rank makes progress, but a healthy rank can go minutes
without either: a long epoch under `fit(verbose=2)` prints once, a script's own loop prints
when it likes, a leader evaluates or saves alone while the others wait. What such a rank does
and a hung one does not is want the CPU: a rank asleep, blocked in a read, deadlocked, waiting
for a peer in a collective or frozen wants none. So every rank program runs a pulse thread
(train.rank.run_rank starts it) that measures, every PULSE_SECONDS, how much of that time its
threads ran or were ready to run (the kernel's schedstat: time on a CPU plus time waiting for
one, so that a rank on a crowded host counts as working as much as one on an idle host) and,
when that is at least BUSY_CORES, writes `TRAIN-ACTIVE cpu=N` to stderr, in one `os.write` of
one whole line: never into the middle of a line the script is writing to stdout. The launcher
swallows these lines.

Waiting that burns CPU without working is kept out of the measure:
- Horovod's background thread negotiates with the other ranks every cycle, and spins in MPI
  (yielding, but runnable) while a peer does not answer: the threads that Horovod's `init`
  starts are not counted.
- JAX's distributed runtime wakes on timers whatever the process does: Gloo's event loop
  every 10 ms, the coordination service's gRPC threads on theirs. Those threads are not
  counted either (exclude_jax_threads); the CPU backend's compute threads are.
- The trainer's own per-step MPI agreement waits without spinning (train.agreement.agree).
A script's own busy-wait loop counts as computing. A frozen process's pulse is frozen with it,
and a rank whose C code holds the interpreter lock through a whole pulse is not heard from
meanwhile (TensorFlow, JAX and NumPy release it while they compute).

Waiting on I/O is not a hang either, but it wants no CPU: a rank in a slow HTTP call (a
tracking server, S3) while the others wait for it in a collective. So a pulse that finds too
little CPU looks at what the main thread is blocked in (`io_wait`: the kernel's
/proc/self/task/N/syscall, the system call and its arguments): reading, writing, connecting or
polling a socket is waiting on the network, reading or writing a regular file waiting on the
disk, and the pulse says so (`TRAIN-ACTIVE cpu=0.00 io=network`); the watchdog allows such a
wait a bounded time (container.watchdog.IO_WAIT_LIMIT). A lock, a pipe, a collective, a
sleep, `epoll`/`select` (whose file descriptors it does not read) are not I/O here.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from job.protocol import PULSE_SECONDS, active_line, progress_line

# System calls whose first argument is the file descriptor the thread waits on: read, write,
# their vector and positional forms, send/recv, connect, accept, fsync; and poll/ppoll, whose
# first two are an array of `struct pollfd` (int fd; short events; short revents) and its
# length. By machine, as the kernel numbers them (x86_64: arch/x86/entry/syscalls; aarch64:
# the generic table).
_FD_CALLS = {
    "x86_64": {0, 1, 17, 18, 19, 20, 42, 43, 44, 45, 46, 47, 74, 75, 288, 295, 296},
    "aarch64": {63, 64, 65, 66, 67, 68, 69, 70, 82, 83, 202, 203, 206, 207, 211, 212, 242},
}
_POLL_CALLS = {"x86_64": {7, 271}, "aarch64": {73}}
_MACHINE = platform.machine()

# Measured with 2 ranks on 2 cores: a rank that computes wants about a core or more (0.9-2.5,
# more when other jobs crowd the host); a rank asleep or waiting for a peer in a collective,
# its communication threads left out, under 0.01.
BUSY_CORES = 0.1


def thread_ids() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/task")}


def thread_demand(thread_id: int) -> float:
    """Seconds one thread of this process has run or waited to run; 0 when it has ended."""
    try:
        running, waiting, _ = Path(f"/proc/self/task/{thread_id}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0
    return (int(running) + int(waiting)) / 1e9


class Pulse:
    """This process's pulse; `excluded` holds the communication threads' ids."""

    excluded: set[int] = set()

    @classmethod
    def start(cls, interval: float = PULSE_SECONDS) -> None:
        threading.Thread(
            target=cls._beat, args=(interval,), name="train-pulse", daemon=True
        ).start()

    @classmethod
    def demand(cls) -> dict[int, float]:
        """Each thread's demand for the CPU so far, this pulse's own thread and the excluded
        ones left out."""
        left_out = cls.excluded | {threading.get_native_id()}
        return {thread: thread_demand(thread) for thread in thread_ids() - left_out}

    @classmethod
    def _beat(cls, interval: float) -> None:
        clock, before = time.monotonic(), cls.demand()
        while True:
            time.sleep(interval)
            now, after = time.monotonic(), cls.demand()
            # a thread started since the last pulse counts from its start; one ended is gone
            cores = sum(
                seconds - before.get(thread, 0.0) for thread, seconds in after.items()
            ) / max(now - clock, 1e-3)
            clock, before = now, after
            if cores >= BUSY_CORES:
                line = active_line(cores)
            elif (waiting := io_wait(threading.main_thread().native_id or 0)) is not None:
                line = active_line(cores, waiting)
            else:
                continue
            if not say(line):
                return

    @classmethod
    def last(cls) -> None:
        """A heartbeat as the rank program returns: the interpreter's teardown follows (atexit
        handlers, MPI_Finalize, freeing the model), during which the pulse thread no longer
        runs; the watchdog's allowance starts again here."""
        say(progress_line(None))


def io_wait(thread_id: int) -> str | None:
    """ "network" or "disk" when that thread of this process is blocked in a system call on a
    socket or a regular file, else None (running, or waiting on anything else)."""
    try:
        fields = Path(f"/proc/self/task/{thread_id}/syscall").read_text().split()
        call, args = int(fields[0]), [int(field, 16) for field in fields[1:7]]
    except (OSError, ValueError, IndexError):  # "running", or an ended thread
        return None
    if call in _FD_CALLS.get(_MACHINE, ()):
        return _waits_on(args[0])
    if call in _POLL_CALLS.get(_MACHINE, ()):
        try:  # the array is in this process's memory: read it as the kernel does
            with open("/proc/self/mem", "rb", buffering=0) as memory:
                array = os.pread(memory.fileno(), 8 * min(args[1], 64), args[0])
        except OSError:
            return None
        kinds = {
            _waits_on(int.from_bytes(array[at : at + 4], "little", signed=True))
            for at in range(0, len(array) - 7, 8)
        }
        return "network" if "network" in kinds else "disk" if "disk" in kinds else None
    return None


def _waits_on(descriptor: int) -> str | None:
    """ "network" for an IP socket, "disk" for a regular file; None for anything else: a pipe
    or a Unix socket is another process of this host, which may never answer."""
    if descriptor < 0:
        return None
    try:
        mode = os.stat(f"/proc/self/fd/{descriptor}").st_mode
        target = os.readlink(f"/proc/self/fd/{descriptor}")  # socket:[INODE] for a socket
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return "disk"
    if stat.S_ISSOCK(mode) and _ip_socket(target.removeprefix("socket:[").rstrip("]")):
        return "network"
    return None


def _ip_socket(inode: str) -> bool:
    """Whether the socket of that inode is a TCP or UDP one: the kernel's tables of this
    network namespace list them by inode (column 10). Read rather than asked of the socket
    itself: a Python socket object made from a copy of the descriptor would set the shared
    file's non-blocking flag when socket.setdefaulttimeout is in force."""
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/self/net/{table}") as rows:
                next(rows, None)  # the header
                if any(row.split()[9:10] == [inode] for row in rows):
                    return True
        except OSError:
            continue
    return False


def say(line: str) -> bool:
    """`line` to stderr in one write; False when stderr is gone (and so is anyone to tell)."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        return False
    return True


def excluding_new_threads(function: Callable) -> Callable:
    """`function`, with the threads it starts left out of the pulse."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        before = thread_ids()
        try:
            return function(*args, **kwargs)
        finally:
            Pulse.excluded |= thread_ids() - before

    call.excludes_new_threads = True  # type: ignore[attr-defined]  # read by the getattr()s below
    return call


def exclude_horovod_threads() -> None:
    """Leave out the threads of Horovod's `init` (its background thread), where Horovod is
    installed. Done on the class before any rank program imports `horovod.tensorflow`, whose
    `init` is the method of an instance of it, looked up when that module is imported."""
    if importlib.util.find_spec("horovod") is None:
        return
    from horovod.common.basics import HorovodBasics

    if not getattr(HorovodBasics.init, "excludes_new_threads", False):
        HorovodBasics.init = excluding_new_threads(HorovodBasics.init)


def exclude_jax_threads(jax: Any) -> None:
    """Leave out the threads of JAX's distributed runtime in this process (`jax`, imported).

    Measured on the TF 2.21 image (JAX 0.10.2), two processes on a crowded 2-core host, one
    frozen and the other idle in a collective: the idle one wanted 0.2-0.42 cores, above
    BUSY_CORES, almost all of it run-queue wait of threads that wake on timers, started by
    two calls:
    - `jax.distributed.initialize`: the coordination service's gRPC client (and on process 0
      its server), 15 threads, together 0.06-0.09 cores;
    - the CPU backend's `make_gloo_tcp_collectives`: one thread, Gloo's TCP event loop, whose
      `epoll_wait` returns every 10 ms: 0.14-0.33 cores.
    With both left out, the idle process measured 0.0000 cores. They are left out by the call that starts
    them, not by name: Gloo's thread bears its creator's name ("python"), as do ten of the
    twelve threads that the backend's `make_cpu_client` starts right after it, among them the
    pools XLA computes on, which must count. The Gloo call is looked up in JAX's private
    `jax._src.lib._jax`, where JAX's xla_bridge calls it; a JAX that moved it keeps that thread
    counted (tests/image/test_keras_jax.py's frozen process then runs on and fails)."""
    distributed = jax.distributed
    if not getattr(distributed.initialize, "excludes_new_threads", False):
        distributed.initialize = excluding_new_threads(distributed.initialize)
    native = getattr(getattr(getattr(jax, "_src", None), "lib", None), "_jax", None)
    gloo = getattr(native, "make_gloo_tcp_collectives", None)
    if native is not None and gloo is not None and not getattr(gloo, "excludes_new_threads", False):
        native.make_gloo_tcp_collectives = excluding_new_threads(gloo)
