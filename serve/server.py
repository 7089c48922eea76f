"""Runs the app under gunicorn, configured for a TensorFlow model behind SageMaker.

- The master binds the port at once and never imports TensorFlow (`preload_app` is off):
  TensorFlow's thread pools do not survive fork, and each worker's copy would be wasted.
- Each worker builds the app right after fork, starts loading the model in a background
  thread and serves at once: /ping answers 503 within milliseconds until the model is
  loaded and warmed up. A model that cannot load leaves the worker up, answering 503 with
  the reason, instead of exiting and being restarted forever.
- Workers are `gthread` (serve.keepalive: a request thread keeps a busy kept-alive
  connection): one process holds the model once and many request threads share it
  through the micro-batcher, which is what lets concurrent requests share model calls. By
  default there is one worker per core on CPU hosts and one per GPU on GPU hosts (serve.host);
  on a GPU host each worker sees only its own GPU (CUDA_VISIBLE_DEVICES, set after fork).
- SIGTERM stops accepting, lets in-flight requests finish and exits within
  GRACEFUL_TIMEOUT_S, inside the 30 s SageMaker allows before SIGKILL.
"""

from __future__ import annotations

import os
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger

from serve.config import ServeConfig
from serve.host import gpu_count
from serve.keepalive import COUNTS, KeepAliveWorker
from serve.logs import logging_config

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
    """In the worker, after fork and before TensorFlow is imported: the GPU of its slot, which
    the master gave it (ConnectionCounts.assign) as the lowest no live worker holds."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(worker.slot % gpu_count())


def gunicorn_options(config: ServeConfig) -> dict[str, Any]:
    """gunicorn's settings for `config`."""
    gpu_hooks = {"post_fork": _pin_gpu} if gpu_count() else {}
    return {**gpu_hooks,
        "pre_fork": COUNTS.assign,
        "child_exit": COUNTS.free,
        "bind": [f"0.0.0.0:{config.port}"],
        "workers": config.workers,
        "worker_class": KeepAliveWorker,
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

    def load(self):
        # Imported here, in the worker: Flask and numpy take half a second to import, and the
        # master must bind the port within SageMaker's 250 ms of start.
        from serve.worker import build_worker_app

        return build_worker_app(self._config)


def run_server(config: ServeConfig) -> None:
    """Serve until SIGTERM or SIGINT; gunicorn exits the process when done."""
    _Gunicorn(config).run()
