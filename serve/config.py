"""The server's settings: one frozen dataclass, read from the environment once, at start.

SageMaker configures a model server only through environment variables, so every knob is one.
The SageMaker names are used where SageMaker defines the setting; the batching and threading
knobs, which SageMaker does not know about, are prefixed `SERVE_`. A value that does not parse
or is out of range stops the server at start with a message naming the variable and the
allowed range, instead of surfacing later as odd behaviour.

A worker holds up to SERVE_THREADS requests; at most SERVE_MAX_QUEUE of them wait for the
model, and one more is refused at once (503, Retry-After), so a flood is shed, not queued. The
threads beyond the queue leave room for /ping and for bodies still arriving. The queue is as
deep as 64 clients: gunicorn does not spread connections evenly over workers (a soak at
concurrency 64 on two workers once put more than 48 waiting requests on one), and 64 clients
must never be refused.

| variable                          | default | meaning                                        |
| --------------------------------- | ------- | ---------------------------------------------- |
| SAGEMAKER_BIND_TO_PORT            | 8080    | TCP port to listen on (all interfaces)         |
| SAGEMAKER_MODEL_SERVER_WORKERS    | auto    | worker processes (one model each): one per GPU, |
|                                   |         | else one per CPU core                          |
| SAGEMAKER_MODEL_SERVER_TIMEOUT    | 60      | seconds a request may wait for its prediction  |
| SAGEMAKER_MAX_PAYLOAD_IN_MB       | 6       | largest request body; 0 = no limit             |
| SAGEMAKER_MAX_CONCURRENT_TRANSFORMS | 8 per worker | advertised to batch transform  |
| SERVE_THREADS                     | 80      | request threads per worker                     |
| SERVE_MAX_BATCH_SIZE              | 128     | most instances in one model call               |
| SERVE_MAX_QUEUE                   | 64      | requests waiting for the model, per worker     |
| SERVE_DECODE_MB                   | 2 x payload limit | bodies decoded at once, per worker |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from job.paths import DEFAULT_ML_ROOT
from serve.host import cpu_count, default_workers, gpu_count

# Batch transform's default concurrency per worker. Enough requests in flight to keep the model
# busy while others are decoded, and no more: a worker decodes with one interpreter lock, so
# more would not be faster (serve.limits bounds the memory they take while decoded).
TRANSFORMS_PER_WORKER = 8


class ServeConfigError(ValueError):
    """An environment variable or argument holds a value the server cannot run with."""


@dataclass(frozen=True)
class ServeConfig:
    """Everything the server needs to know, validated on construction."""

    ml_root: Path = DEFAULT_ML_ROOT
    port: int = 8080
    workers: int = 1
    threads: int = 80
    timeout_s: int = 60
    max_payload_mb: int = 6
    max_concurrent_transforms: int = 0  # 0: TRANSFORMS_PER_WORKER per worker
    max_batch_size: int = 128
    max_queue: int = 64
    decode_mb: int = 0  # 0: twice the payload limit (12 MB when there is no limit)

    def __post_init__(self) -> None:
        _check("SAGEMAKER_BIND_TO_PORT", self.port, 1, 65535)
        _check("SAGEMAKER_MODEL_SERVER_WORKERS", self.workers, 1, 64)
        _check("SERVE_THREADS", self.threads, 1, 1024)
        _check("SAGEMAKER_MODEL_SERVER_TIMEOUT", self.timeout_s, 1, 3600)
        _check("SAGEMAKER_MAX_PAYLOAD_IN_MB", self.max_payload_mb, 0, 100)
        _check("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", self.max_concurrent_transforms, 0, 65536)
        _check("SERVE_MAX_BATCH_SIZE", self.max_batch_size, 1, 1_000_000)
        _check("SERVE_MAX_QUEUE", self.max_queue, 1, 65536)
        _check("SERVE_DECODE_MB", self.decode_mb, 0, 100_000)

    @property
    def model_dir(self) -> Path:
        """Where SageMaker unpacks the model artifacts (the trainer's /opt/ml/model)."""
        return self.ml_root / "model"

    @property
    def max_payload_bytes(self) -> int | None:
        """The body size limit in bytes, or None when SAGEMAKER_MAX_PAYLOAD_IN_MB is 0."""
        return self.max_payload_mb * 1024 * 1024 or None

    @property
    def decode_budget_bytes(self) -> int:
        """Bytes of request bodies one worker decodes at once (see serve.limits)."""
        return self.decode_mb * 1024 * 1024 or 2 * (self.max_payload_bytes or 6 * 1024 * 1024)

    @property
    def concurrent_transforms(self) -> int:
        """What batch transform is told it may send at once (see TRANSFORMS_PER_WORKER)."""
        return self.max_concurrent_transforms or self.workers * min(
            self.threads, TRANSFORMS_PER_WORKER
        )


def _check(name: str, value: int, minimum: int, maximum: int) -> None:
    if not minimum <= value <= maximum:
        raise ServeConfigError(f"{name}={value} is out of range: expected {minimum} to {maximum}")


def _read(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ServeConfigError(f"{name}={raw!r} is not an integer") from None


def config_from_env(ml_root: Path, env: Mapping[str, str] | None = None) -> ServeConfig:
    """Build the config from SageMaker's environment variables (os.environ by default)."""
    env = os.environ if env is None else env
    defaults = ServeConfig()
    return ServeConfig(
        ml_root=ml_root,
        port=_read(env, "SAGEMAKER_BIND_TO_PORT", defaults.port),
        workers=_read(
            env, "SAGEMAKER_MODEL_SERVER_WORKERS", default_workers(cpu_count(), gpu_count())
        ),
        threads=_read(env, "SERVE_THREADS", defaults.threads),
        timeout_s=_read(env, "SAGEMAKER_MODEL_SERVER_TIMEOUT", defaults.timeout_s),
        max_payload_mb=_read(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB", defaults.max_payload_mb),
        max_concurrent_transforms=_read(
            env, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", defaults.max_concurrent_transforms
        ),
        max_batch_size=_read(env, "SERVE_MAX_BATCH_SIZE", defaults.max_batch_size),
        max_queue=_read(env, "SERVE_MAX_QUEUE", defaults.max_queue),
        decode_mb=_read(env, "SERVE_DECODE_MB", defaults.decode_mb),
    )
