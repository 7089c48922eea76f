"""Runs the app under gunicorn, configured for a TensorFlow model behind SageMaker.

- The master never imports TensorFlow (`preload_app` is off): TensorFlow's thread pools do
  not survive fork, and each worker's copy would be wasted. It forks the workers at once.
- Each worker listens on a socket of its own, bound right after fork with SO_REUSEPORT
  (gunicorn's `reuse_port`), so the kernel spreads new connections over the workers. With
  one shared socket the workers race for each connection, a kept-alive connection stays with
  the winner, and 64 clients connecting at once were split as unevenly as 62/2; the busier
  worker then set the tail (MLP p99 at c=32: 82 ms shared, 59 ms with a socket per worker,
  against the careful baseline's 64, docs/performance.md).
- Each worker builds the app right after fork, starts loading the model in a background
  thread and serves at once: /ping answers 503 within milliseconds until the model is
  loaded and warmed up. A model that cannot load leaves the worker up, answering 503 with
  the reason, instead of exiting and being restarted forever.
- Workers are gunicorn's own `gthread` workers, configured through gunicorn's documented
  settings and server hooks only: one process holds the model once and many request threads
  share it through the micro-batcher, which is what lets concurrent requests share model
  calls. By default there is one worker per core on CPU hosts and one per GPU on GPU hosts
  (serve.host); on a GPU host each worker sees only its own GPU (CUDA_VISIBLE_DEVICES, set
  after fork).
- The public port belongs to the intake (serve.intake), an asyncio proxy in this process that
  passes a request on to gunicorn, on a loopback port, only once it has all arrived or its
  deadline has passed: no setting or hook of gunicorn keeps a client that stalls from holding
  a request thread. gunicorn's master and workers are a child process of it.
- Each worker's Python threads run on one core, a different one per worker (its slot in
  WorkerSlots, which a replacement inherits); its model's threads run on every core.
- SIGTERM stops accepting (the intake at once, and gunicorn, to which it passes the signal),
  lets in-flight requests finish and exits within GRACEFUL_TIMEOUT_S, inside the 30 s
  SageMaker allows before SIGKILL.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger

from serve.config import ServeConfig
from serve.host import WorkerSlots, gpu_count, worker_core
from serve.intake import Intake
from serve.logs import logging_config

if TYPE_CHECKING:  # the master never imports Flask (see _Gunicorn.load)
    from flask import Flask

GRACEFUL_TIMEOUT_S = 20
# Longer than the idle timeout of the load balancer in front, so that it, not the server,
# closes idle connections and never sends a request on a connection being closed.
KEEPALIVE_S = 75


class NoAccessLogger(Logger):
    """gunicorn's logger without its access log: serve.app logs failed requests itself.
    gunicorn would otherwise build its access-log fields for every request (tens of
    microseconds) whenever a logging config is given, then drop them."""

    access_log_enabled = False


def _pin_gpu(server: Any, worker: Any) -> None:
    """gunicorn's `post_fork` hook, in the worker before TensorFlow is imported: the GPU of the
    slot the master gave it (WorkerSlots)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(worker.slot % gpu_count())


def _pin_python(worker: Any) -> None:
    """gunicorn's `post_worker_init` hook: the worker's main thread, and so every request thread
    it starts from now on, runs on the core of its slot.

    The threaded worker hands each request from its event loop to a request thread and back;
    threads free to run on any core wake each other across cores, which cost about a fifth of
    an MLP request's CPU (docs/performance.md). One core loses no parallelism to Python, which
    runs one thread at a time per worker under its interpreter lock. The hook runs after the
    app is built, when the thread loading the model has started with every core: TensorFlow's
    thread pools, started from it, keep them all, so one model call still spreads over the
    whole machine.
    """
    os.sched_setaffinity(0, {worker_core(worker.slot, os.sched_getaffinity(0))})


def gunicorn_options(config: ServeConfig, upstream_port: int) -> dict[str, Any]:
    """gunicorn's settings for `config`, listening on the loopback's `upstream_port` behind the
    intake. gunicorn's `timeout` is the request timeout; `keepalive` is how long a connection
    waits for its next request, which the intake's idle connections wait too."""
    slots = WorkerSlots()
    gpu_hooks = {"post_fork": _pin_gpu} if gpu_count() else {}
    return {
        **gpu_hooks,
        "pre_fork": slots.assign,
        "child_exit": slots.free,
        "post_worker_init": _pin_python,
        "bind": [f"127.0.0.1:{upstream_port}"],
        "reuse_port": True,
        "workers": config.workers,
        "worker_class": "gthread",
        "threads": config.threads,
        "timeout": config.timeout_s,
        "graceful_timeout": GRACEFUL_TIMEOUT_S,
        "keepalive": KEEPALIVE_S,
        "preload_app": False,
        "accesslog": None,
        "logger_class": NoAccessLogger,
        "logconfig_dict": logging_config(),
        "control_socket_disable": True,  # one fixed socket path per user would clash
        "proc_name": "serve",
    }


class _Gunicorn(BaseApplication):
    def __init__(self, config: ServeConfig, upstream_port: int):
        self._config = config
        self._upstream_port = upstream_port
        super().__init__()

    def load_config(self) -> None:
        for name, value in gunicorn_options(self._config, self._upstream_port).items():
            self.cfg.set(name, value)

    def load(self) -> Flask:
        # Imported here, in the worker: Flask and numpy take half a second to import, and the
        # master must bind the port within SageMaker's 250 ms of start.
        from serve.worker import build_worker_app

        return build_worker_app(self._config)


class PortInUse(Exception):
    """Another process listens on the port."""


def bind_public(port: int) -> socket.socket:
    """The intake's listening socket on `port`; PortInUse when another process listens on it
    (SO_REUSEADDR: connections of a previous server still in TIME_WAIT do not count).

    Made with its protocol named, IPPROTO_TCP: asyncio turns Nagle's algorithm off only on such
    sockets, and with it on, an answer's body waited for the client's delayed acknowledgement
    of its head (40 ms; measured on the MLP: 1 ms answers took 44 to 52)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("0.0.0.0", port))
    except OSError as error:
        listener.close()
        if error.errno != errno.EADDRINUSE:
            raise
        raise PortInUse(
            f"port {port} is in use by another process; stop it or choose "
            "another port with SAGEMAKER_BIND_TO_PORT"
        ) from None
    listener.listen(2048)
    return listener


def reserve_loopback_port() -> socket.socket:
    """A port on the loopback for gunicorn behind the intake, held for it: a socket bound to
    it with SO_REUSEPORT and never listening, so that gunicorn's workers (which bind with
    SO_REUSEPORT too, gunicorn's `reuse_port`) can listen on it while no other program can take
    it between now and then, and no connection ever reaches this socket."""
    reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserved.bind(("127.0.0.1", 0))
    return reserved


def run_server(config: ServeConfig) -> None:
    """Serve until SIGTERM or SIGINT, then exit with gunicorn's exit status. The port is bound
    before anything else (SageMaker wants connections taken within 250 ms of start); gunicorn
    runs in a child process, forked before this one starts any thread."""
    listener = bind_public(config.port)
    reserved = reserve_loopback_port()
    upstream_port: int = reserved.getsockname()[1]
    gunicorn_pid = os.fork()
    if gunicorn_pid == 0:
        listener.close()
        reserved.close()  # this process's copy holds the port
        _Gunicorn(config, upstream_port).run()  # exits the process when gunicorn stops
    with reserved:
        sys.exit(run_intake(listener, upstream_port, config, gunicorn_pid))


def run_intake(
    listener: socket.socket, upstream_port: int, config: ServeConfig, gunicorn_pid: int
) -> int:
    """Run the intake until gunicorn's master exits; its exit status (128 + the signal that
    ended it). SIGTERM and SIGINT stop the intake taking connections and go on to gunicorn,
    which finishes the requests it has; the connections still open are closed when it exits."""
    loop = asyncio.new_event_loop()
    intake = Intake(loop, upstream_port, config.timeout_s, KEEPALIVE_S)
    server = loop.run_until_complete(intake.serve(listener))
    exited: asyncio.Future[int] = loop.create_future()

    def stop(signum: int) -> None:
        intake.stopping = True
        server.close()
        os.kill(gunicorn_pid, signum)

    def reap() -> None:
        pid, status = os.waitpid(gunicorn_pid, os.WNOHANG)
        if pid and not exited.done():
            code = os.waitstatus_to_exitcode(status)
            exited.set_result(code if code >= 0 else 128 - code)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    loop.add_signal_handler(signal.SIGCHLD, reap)
    try:
        reap()  # in case gunicorn ended before the handler was in place
        code = loop.run_until_complete(exited)
    finally:
        if not exited.done():  # the intake failed: gunicorn must not outlive it
            os.kill(gunicorn_pid, signal.SIGTERM)
    server.close()
    intake.close_all()
    loop.run_until_complete(asyncio.sleep(0))  # the closing connections write what is left
    loop.close()
    return code
