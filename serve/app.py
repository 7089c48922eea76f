"""The HTTP interface SageMaker hosting and batch transform call: a Flask app.

| route                      | answer                                                         |
| -------------------------- | -------------------------------------------------------------- |
| GET /ping                  | 200 (empty) once the model is loaded and warmed up, else 503;  |
|                            | 503 again while a model call has run longer than the timeout   |
| POST /invocations          | predictions; see serve.codecs for the formats                  |
| GET /execution-parameters  | what batch transform may send: concurrency, strategy, size     |
| GET /metrics               | this worker's micro-batching counters (see serve.batching)     |

An invocation flows read -> decode -> validate -> predict -> encode, against one deadline:
the request timeout, counted from its first byte (serve.intake). A body not all received by
then gets 408 (the client's delay, not the server's), after which the connection ends (the
intake ended its connection to gunicorn at the deadline). The body is decoded only once the
worker's decode budget has room for it (serve.limits), and waits for the model in a bounded queue
(serve.batching); a request that cannot be answered by its deadline gets 503 then and is
never computed later. A request whose body is over the limit is answered 413 after its body
is read and dropped, so that the client, still sending, is not cut off before it can read the
answer. Every failure is an exception, and `_error_response` is the one place that turns
exceptions into HTTP answers, all of them `{"error": "..."}`: a `RequestError` carries its
own status and message, werkzeug's routing and size errors become 404, 405 and 413, and
anything else is a fault of the server: a 500 whose cause is logged. Every failed request
(status 400 and above) is logged as one JSON line (method, path, status, latency);
successful ones are not: SageMaker already counts them and their latency (CloudWatch
`Invocations`, `ModelLatency`), and a log line costs about 30 microseconds, a tenth of a small
model's whole request.

This module imports no TensorFlow, so creating the app is instant (see serve.model).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

from flask import Flask, Response, g, request
from werkzeug.exceptions import (
    ClientDisconnected,
    HTTPException,
    MethodNotAllowed,
    NotFound,
    RequestEntityTooLarge,
)

from serve.batching import MicroBatcher, Overloaded
from serve.codecs import decode, encode, negotiate
from serve.config import ServeConfig
from serve.errors import BadInput, BodyTimeout, ModelUnavailable, RequestError
from serve.intake import arrived
from serve.limits import DecodeBudget
from serve.model import Model
from serve.validation import validate

log = logging.getLogger(__name__)

ROUTES = "GET /ping, POST /invocations, GET /execution-parameters, GET /metrics"
# An over-limit body is read and dropped up to this size, so its client can read the 413; a
# larger one is cut off (the client may then see the connection reset instead).
DRAIN_LIMIT_BYTES = 256 * 1024 * 1024
RETRY_AFTER_S = 1
# Small enough that a chunked body is refused soon after it passes the payload limit, large
# enough that a 6 MB body takes only about a hundred reads.
READ_CHUNK_BYTES = 64 * 1024


def _check_not_stalled(batcher: MicroBatcher, config: ServeConfig) -> None:
    stalled_s = batcher.stalled_s()
    if stalled_s > config.timeout_s:
        raise ModelUnavailable(
            f"a model call has not returned for {stalled_s:.0f} s, longer than the "
            f"{config.timeout_s} s request timeout (SAGEMAKER_MODEL_SERVER_TIMEOUT)"
        )


def create_app(
    config: ServeConfig, model: Model, batcher: MicroBatcher, budget: DecodeBudget
) -> Flask:
    """The app serving `model` through `batcher`, decoding within `budget`. The model is not
    loaded here."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_payload_bytes

    @app.get("/ping")
    def ping() -> Response:
        model.check_ready()
        _check_not_stalled(batcher, config)
        return Response(status=200)

    @app.post("/invocations")
    def invocations() -> Response:
        deadline = g.arrived + config.timeout_s
        interface = model.wait_ready(deadline)
        _check_not_stalled(batcher, config)
        media_type = negotiate(request.headers.get("Accept"))
        body = _read_body(config, deadline)
        with budget.hold(len(body), deadline):
            decoded = decode(body, request.mimetype, request.mimetype_params.get("charset"))
            batch = validate(decoded.inputs, interface)
        columnar = decoded.columnar
        del body, decoded  # not held while the request waits for the model
        outputs = batcher.submit(batch, deadline)
        answer = encode(outputs, interface, media_type, columnar=columnar)
        return Response(answer, mimetype=media_type)

    @app.get("/execution-parameters")
    def execution_parameters() -> dict[str, int | str]:
        return {
            "MaxConcurrentTransforms": config.concurrent_transforms,
            "BatchStrategy": "MULTI_RECORD",
            "MaxPayloadInMB": config.max_payload_mb,
        }

    @app.get("/metrics")
    def metrics() -> dict[str, object]:
        return {
            "pid": os.getpid(),
            "model_ready": model.ready,
            "model_call_running_s": round(batcher.stalled_s(), 3),
            "requests_waiting": batcher.waiting(),
            "decoding_peak_bytes": budget.peak_bytes,
            **dataclasses.asdict(batcher.stats),
        }

    @app.errorhandler(Exception)
    def error(exception: Exception) -> Response:
        return _error_response(exception, config)

    @app.before_request
    def start_clock() -> None:
        g.started, g.arrived = time.perf_counter(), arrived(request.environ)

    @app.after_request
    def log_failure(response: Response) -> Response:
        if response.status_code >= 400:
            latency_ms = (time.perf_counter() - g.started) * 1000
            log.info(
                "request",
                extra={
                    "fields": {
                        "method": request.method,
                        "path": request.path,
                        "status": response.status_code,
                        "latency_ms": round(latency_ms, 3),
                    }
                },
            )
        return response

    return app


def _error_response(exception: Exception, config: ServeConfig) -> Response:
    """The one mapping from an exception to an HTTP answer."""
    headers = {}
    if isinstance(exception, RequestError):
        status, message = exception.status, str(exception)
    elif isinstance(exception, TimeoutError):  # the batcher's or the decode budget's deadline
        status, message = (
            ModelUnavailable.status,
            (
                f"no prediction within {config.timeout_s} s (SAGEMAKER_MODEL_SERVER_TIMEOUT): "
                "the server is overloaded"
            ),
        )
    elif isinstance(exception, Overloaded):
        status, message = (
            ModelUnavailable.status,
            (
                f"the server is overloaded ({exception}, SERVE_MAX_QUEUE={config.max_queue}); "
                f"retry in {RETRY_AFTER_S} s"
            ),
        )
        headers["Retry-After"] = str(RETRY_AFTER_S)
    elif isinstance(exception, RequestEntityTooLarge):
        status, message = (
            exception.code,
            (
                f"the request body is larger than {config.max_payload_mb} MB, the limit set by "
                "SAGEMAKER_MAX_PAYLOAD_IN_MB; split it into smaller requests"
            ),
        )
        _drain_body()
        headers["Connection"] = "close"
    elif isinstance(exception, NotFound):
        status, message = exception.code, f"no such path {request.path!r}; use {ROUTES}"
    elif isinstance(exception, MethodNotAllowed):
        allowed = ", ".join(sorted(exception.valid_methods or ()))
        status = exception.code
        message = f"{request.method} is not allowed on {request.path}; use {allowed}"
        headers["Allow"] = allowed
    elif isinstance(exception, HTTPException) and exception.code is not None:
        # werkzeug's others; Flask answers a code-less (proxy) one itself, never calling this
        status, message = exception.code, exception.description or exception.name
    else:
        log.error("the server failed on %s %s", request.method, request.path, exc_info=exception)
        status, message = 500, "the server failed to answer; the cause is in its log"
    return Response(
        json.dumps({"error": message}), status=status, mimetype="application/json", headers=headers
    )


def _read_body(config: ServeConfig, deadline: float) -> bytes:
    """The request body; RequestEntityTooLarge as soon as it passes the payload limit;
    BodyTimeout when it ends early at `deadline` (time.monotonic()), BadInput before.

    A declared Content-Length over the limit fails before anything is read (werkzeug checks
    MAX_CONTENT_LENGTH); a chunked body, which declares no length, is read until it passes it.
    No read here waits past the deadline: the intake (serve.intake) passes the request on
    once it has all arrived, or else ends its connection to gunicorn at the deadline, so the
    body of a client that stalls or trickles ends early then. A body that ends early is
    never decoded: under gunicorn a read returns no more at the end of the stream, whatever
    the Content-Length said, and a CSV cut after a line would pass for a whole one.
    """
    limit = config.max_payload_bytes
    chunks, size = [], 0
    try:
        while chunk := request.stream.read(READ_CHUNK_BYTES):
            size += len(chunk)
            if limit is not None and size > limit:
                raise RequestEntityTooLarge()
            chunks.append(chunk)
    except ClientDisconnected:  # a failed read: a chunked body cut short, a reset connection
        ended_early = True
    else:
        ended_early = request.content_length is not None and size < request.content_length
    if not ended_early:
        return b"".join(chunks)
    if time.monotonic() >= deadline:
        raise BodyTimeout(
            f"the request body had not fully arrived {config.timeout_s} s after the request "
            "began (SAGEMAKER_MODEL_SERVER_TIMEOUT); send it faster, or in smaller requests"
        )
    raise BadInput(
        f"the request body ended after {size} bytes, before the end its "
        "Content-Length or chunks declare: the client stopped sending; send the "
        "whole body"
    )


def _drain_body() -> None:
    """Read and drop what is left of the request body, up to DRAIN_LIMIT_BYTES; nothing when
    it declares more (it would be cut off anyway, and a client declaring, say, 10^30 bytes
    would otherwise hold the thread until its deadline)."""
    if (request.content_length or 0) > DRAIN_LIMIT_BYTES:
        return
    stream = request.environ["wsgi.input"]
    remaining = DRAIN_LIMIT_BYTES
    while remaining > 0:
        chunk = stream.read(min(remaining, READ_CHUNK_BYTES))
        if not chunk:
            return
        remaining -= len(chunk)
