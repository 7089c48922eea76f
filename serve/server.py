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
- Workers are gunicorn's own `gthread` workers: one process holds the model once and many
  request threads share it through the micro-batcher, which is what lets concurrent
  requests share model calls. They are configured through gunicorn's documented settings and
  server hooks, and their thread pool is replaced through the one override gthread offers
  (`get_thread_pool`) by the intake (serve.intake), which gives a request a thread only once
  it has all arrived or its deadline has passed: no setting or hook keeps a client that
  stalls from holding a thread. By default there is one worker per core on CPU hosts and one
  per GPU on GPU hosts (serve.host); on a GPU host each worker sees only its own GPU
  (CUDA_VISIBLE_DEVICES, set after fork).
- Each worker's Python threads run on one core, a different one per worker (its slot in
  WorkerSlots, which a replacement inherits); its model's threads run on every core.
- SIGTERM stops accepting, lets in-flight requests finish and exits within
  GRACEFUL_TIMEOUT_S, inside the 30 s SageMaker allows before SIGKILL.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import TYPE_CHECKING, Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger
from gunicorn.workers.gthread import ThreadWorker

from serve.config import ServeConfig
from serve.host import WorkerSlots, gpu_count, worker_core
from serve.intake import IntakePool
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


class Worker(ThreadWorker):
    """gunicorn's threaded worker, its request threads behind the intake (serve.intake): a
    client that stalls or trickles waits for its deadline on no thread, so `/ping` and every
    other request still find one. gunicorn's `timeout` is the request timeout
    (gunicorn_options); a connection that has sent nothing waits its `keepalive`."""

    def get_thread_pool(self) -> IntakePool:
        return IntakePool(
            self.cfg.threads, request_timeout_s=self.cfg.timeout, idle_timeout_s=self.cfg.keepalive
        )


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


def gunicorn_options(config: ServeConfig) -> dict[str, Any]:
    """gunicorn's settings for `config`."""
    slots = WorkerSlots()
    gpu_hooks = {"post_fork": _pin_gpu} if gpu_count() else {}
    return {
        **gpu_hooks,
        "pre_fork": slots.assign,
        "child_exit": slots.free,
        "post_worker_init": _pin_python,
        "bind": [f"0.0.0.0:{config.port}"],
        "reuse_port": True,
        "workers": config.workers,
        "worker_class": Worker,
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
    def __init__(self, config: ServeConfig):
        self._config = config
        super().__init__()

    def load_config(self) -> None:
        for name, value in gunicorn_options(self._config).items():
            self.cfg.set(name, value)

    def load(self) -> Flask:
        # Imported here, in the worker: Flask and numpy take half a second to import, and the
        # master must bind the port within SageMaker's 250 ms of start.
        from serve.worker import build_worker_app

        return build_worker_app(self._config)


class PortInUse(Exception):
    """Another process listens on the port."""


def check_port_free(port: int) -> None:
    """Raise PortInUse when another process listens on `port`. The workers bind with
    SO_REUSEPORT after fork; a port held by another program would make each of them fail and
    be restarted forever, and a port held by another `serve` would silently share its clients,
    so the master binds once without SO_REUSEPORT first and lets go (SO_REUSEADDR: connections
    of a previous server still in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise PortInUse(
                f"port {port} is in use by another process; stop it or choose "
                "another port with SAGEMAKER_BIND_TO_PORT"
            ) from None


def run_server(config: ServeConfig) -> None:
    """Serve until SIGTERM or SIGINT; gunicorn exits the process when done."""
    check_port_free(config.port)
    _Gunicorn(config).run()
