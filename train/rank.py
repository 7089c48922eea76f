"""Who this rank is, and the wrapper every rank program runs inside.

The launcher puts the job's sorted hosts and ranks per host into each rank's environment
(TRAIN_HOSTS, TRAIN_PROCESSES_PER_HOST, TRAIN_ML_ROOT); OpenMPI adds the rank numbers. From
these a rank knows its own host without trusting any inherited SM_CURRENT_HOST. Run outside
the launcher (plain `mpirun` or `python script.py`), a rank falls back to one host.

`run_rank` installs the stop signal first (before TensorFlow is imported, which takes
seconds) and the stack dump the launcher's watchdog asks for with SIGUSR2 (train.progress),
starts the pulse that tells the watchdog when this rank computes (train.activity), and turns
any exception into a one-line failure report for the launcher (with the error's kind, so a
ConfigError or DataError ends the job as a configuration error). A failed rank then leaves at
once, without the interpreter's teardown: that teardown may wait for the other ranks, which
are themselves waiting for this one in a collective (JAX's distributed shutdown holds a
process up to 300 s at a barrier; mpi4py's abort comes only after it), so mpirun would not
learn of the failure until a watchdog fired. Its exit ends the job: mpirun stops the others.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn

from job.errors import PlatformError
from job.paths import DEFAULT_ML_ROOT, MlPaths
from job.protocol import rank_failure
from job.rank_job import DATA_HOST_ENV
from job.sagemaker_config import configured_paths
from train.activity import Pulse, exclude_horovod_threads


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    host: str
    hosts: tuple[str, ...]
    paths: MlPaths

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def emit(line: str) -> None:
    """One line of the protocol with the launcher (job.protocol: progress, marks, metrics, a
    stop) on stdout, in one write: mpirun tags each write, so a split line gets torn. Not
    through the log (train.logs): a user's script configures logging in its process, and a
    script that disables the loggers that exist must not silence what the watchdog and the
    failure report read."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    return int(environ.get(name, default))


def world_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank, the one answer to "am I the leader (rank 0)?": Open MPI's number;
    0 outside mpirun and on a data host, whose script runs alone, outside the ranks' world."""
    return 0 if environ.get(DATA_HOST_ENV) else _int(environ, "OMPI_COMM_WORLD_RANK", 0)


def context_from_environment(environ: Mapping[str, str] = os.environ) -> RankContext:
    rank = world_rank(environ)
    world_size = _int(environ, "OMPI_COMM_WORLD_SIZE", 1)
    local_rank = _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK", rank)
    local_size = _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", world_size)
    paths = configured_paths(Path(environ.get("TRAIN_ML_ROOT", str(DEFAULT_ML_ROOT))))
    if environ.get(DATA_HOST_ENV):  # a data host's script: no rank, its own host
        return RankContext(
            0, 1, 0, 1, environ[DATA_HOST_ENV], tuple(environ["TRAIN_HOSTS"].split(",")), paths
        )
    if "TRAIN_HOSTS" not in environ:
        host = socket.gethostname()
        return RankContext(rank, world_size, local_rank, local_size, host, (host,), paths)
    hosts = tuple(environ["TRAIN_HOSTS"].split(","))
    per_host = _int(environ, "TRAIN_PROCESSES_PER_HOST", 1)
    if world_size != len(hosts) * per_host or local_rank != rank % per_host:
        raise PlatformError(
            f"rank {rank} was placed unexpectedly (world size {world_size}, local rank "
            f"{local_rank}; planned {len(hosts)} hosts x {per_host}); do not override -np, "
            f"-H or --map-by in mpi_options"
        )
    return RankContext(
        rank, world_size, local_rank, local_size, hosts[rank // per_host], hosts, paths
    )


IMPORT_MACHINERY = "<frozen importlib._bootstrap>"
RETRY_SECONDS = 0.1


def importing(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside an import (any frame below it is the import machinery's)."""
    while frame is not None:
        if frame.f_code.co_filename == IMPORT_MACHINERY:
            return True
        frame = frame.f_back
    return False


class StopRequest:
    """Set when the launcher forwards a stop (SIGUSR1); the trainer polls it between steps.

    A rank program that never polls it (a script that does not use the helper API, or the
    built-in trainer until it arms the request) is stopped by SystemExit instead, which is still
    a clean, reported exit. Not in the middle of an import, though: an exception raised there
    surfaces as that module's failure (numpy's C import, which TensorFlow's takes seconds to
    reach, wraps it in an ImportError and a page of installation advice), so a stop that
    arrives during one is re-sent to the process until the import is over.
    """

    event = threading.Event()
    polled = False

    @classmethod
    def install(cls) -> None:
        signal.signal(signal.SIGUSR1, cls._handle)

    @classmethod
    def _handle(cls, signum: int, frame: FrameType | None) -> None:
        cls.event.set()
        if cls.polled:
            return
        if importing(frame):
            resend = threading.Timer(RETRY_SECONDS, os.kill, (os.getpid(), signum))
            resend.daemon = True
            resend.start()
            return
        raise SystemExit(128 + signal.SIGTERM)

    @classmethod
    def requested(cls) -> bool:
        cls.polled = True
        return cls.event.is_set()

    @classmethod
    def arm(cls) -> None:
        """From now on the caller polls: a stop is a request (honoured after the next step,
        with a checkpoint), no longer an exit."""
        cls.polled = True


def report_failure(rank: int, host: str, error: BaseException) -> None:
    """One failure report on stderr in one write, so mpirun's tag stays on the line."""
    sys.stderr.write(rank_failure(rank, host, error).line() + "\n")
    sys.stderr.flush()


def run_rank(body: Callable[[RankContext], None]) -> None:
    StopRequest.install()
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # the watchdog's stack dump
    exclude_horovod_threads()
    Pulse.start()
    context = None
    try:
        context = context_from_environment()
        body(context)
        Pulse.last()
    except SystemExit as stop:
        if stop.code in (0, None) or StopRequest.event.is_set():
            raise
        report_failure(*_who(context), RuntimeError(f"exited with code {stop.code}"))
        leave(stop.code if isinstance(stop.code, int) else 1)
    except BaseException as error:
        report_failure(*_who(context), error)
        traceback.print_exc()
        leave(1)


def leave(code: int) -> NoReturn:
    """Exit with `code` now, what was written flushed, no atexit handler or finalizer run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _who(context: RankContext | None) -> tuple[int, str]:
    if context:
        return context.rank, context.host
    return world_rank(), socket.gethostname()
