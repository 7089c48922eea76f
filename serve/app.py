"""The HTTP interface SageMaker hosting and batch transform call: a Flask app.

| route                      | answer                                                         |
| -------------------------- | -------------------------------------------------------------- |
| GET /ping                  | 200 (empty) once the model is loaded and warmed up, else 503   |
| POST /invocations          | predictions; see serve.codecs for the formats                  |
| GET /execution-parameters  | what batch transform may send: concurrency, strategy, size     |
| GET /metrics               | this worker's micro-batching counters (see serve.batching)     |

An invocation flows decode -> validate -> predict -> encode. Every failure is an exception,
and `_error_response` is the one place that turns exceptions into HTTP answers, all of them
`{"error": "..."}`: a `RequestError` carries its own status and message, werkzeug's routing
and size errors become 404, 405 and 413, and anything else is a fault of the server: a 500
whose cause is logged. Every request is logged as one JSON line (method, path, status,
latency); successful pings are not, since SageMaker pings every few seconds.

This module imports no TensorFlow, so creating the app is instant (see serve.model).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from serve.batching import MicroBatcher
from serve.codecs import decode, encode, negotiate
from serve.config import ServeConfig
from serve.errors import ModelUnavailable, RequestError
from serve.model import Model
from serve.validation import validate

log = logging.getLogger(__name__)

ROUTES = "GET /ping, POST /invocations, GET /execution-parameters, GET /metrics"


def create_app(config: ServeConfig, model: Model, batcher: MicroBatcher) -> Flask:
    """The app serving `model` through `batcher`; neither is loaded or started here."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_payload_bytes

    @app.get("/ping")
    def ping() -> Response:
        model.check_ready()
        return Response(status=200)

    @app.post("/invocations")
    def invocations() -> Response:
        model.check_ready()
        with batcher.arriving():
            media_type = negotiate(request.headers.get("Accept"))
            decoded = decode(request.get_data(cache=False), request.mimetype,
                             request.mimetype_params.get("charset"))
            batch = validate(decoded.inputs, model.interface)
        outputs = batcher.submit(batch, timeout_s=config.timeout_s)
        return Response(encode(outputs, model.interface, media_type, columnar=decoded.columnar),
                        mimetype=media_type)

    @app.get("/execution-parameters")
    def execution_parameters() -> dict:
        return {"MaxConcurrentTransforms": config.concurrent_transforms,
                "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": config.max_payload_mb}

    @app.get("/metrics")
    def metrics() -> dict:
        return {"pid": os.getpid(), **dataclasses.asdict(batcher.stats)}

    @app.errorhandler(Exception)
    def error(exception: Exception) -> Response:
        return _error_response(exception, config)

    @app.before_request
    def start_clock() -> None:
        g.started = time.perf_counter()

    @app.after_request
    def log_request(response: Response) -> Response:
        if request.path != "/ping" or response.status_code != 200:
            latency_ms = (time.perf_counter() - g.started) * 1000
            log.info("request", extra={"fields": {
                "method": request.method, "path": request.path,
                "status": response.status_code, "latency_ms": round(latency_ms, 3)}})
        return response

    return app


def _error_response(exception: Exception, config: ServeConfig) -> Response:
    """The one mapping from an exception to an HTTP answer."""
    headers = {}
    if isinstance(exception, RequestError):
        status, message = exception.status, str(exception)
    elif isinstance(exception, TimeoutError):  # raised by MicroBatcher.submit
        status, message = ModelUnavailable.status, (
            f"no prediction within {config.timeout_s} s (SAGEMAKER_MODEL_SERVER_TIMEOUT): "
            "the server is overloaded")
    elif isinstance(exception, RequestEntityTooLarge):
        status, message = exception.code, (
            f"the request body is larger than {config.max_payload_mb} MB, the limit set by "
            "SAGEMAKER_MAX_PAYLOAD_IN_MB; split it into smaller requests")
    elif isinstance(exception, NotFound):
        status, message = exception.code, f"no such path {request.path!r}; use {ROUTES}"
    elif isinstance(exception, MethodNotAllowed):
        allowed = ", ".join(sorted(exception.valid_methods or ()))
        status = exception.code
        message = f"{request.method} is not allowed on {request.path}; use {allowed}"
        headers["Allow"] = allowed
    elif isinstance(exception, HTTPException):
        status, message = exception.code, exception.description
    else:
        log.error("the server failed on %s %s", request.method, request.path,
                  exc_info=exception)
        status, message = 500, "the server failed to answer; the cause is in its log"
    return Response(json.dumps({"error": message}), status=status,
                    mimetype="application/json", headers=headers)
