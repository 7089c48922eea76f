"""One JSON object per log line, for the server's own messages and gunicorn's alike.

CloudWatch keeps each line of the container's stderr as one event; JSON lines can be filtered
and aggregated there (e.g. by `status` or `latency_ms`) without parsing free text. A record's
structured fields are passed as `extra={"fields": {...}}`. Request payloads are never logged:
they may hold personal data and can be megabytes long.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    """Formats a record as {"time", "level", "logger", "message", **fields, "exception"}."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def logging_config(level: str = "INFO") -> dict[str, Any]:
    """A logging.config.dictConfig that sends everything, gunicorn's loggers included, to
    stderr as JSON lines; gunicorn takes it as its `logconfig_dict` setting."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"stderr": handler},
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {"level": level, "handlers": [], "propagate": True},
            # serve.app logs each request with its latency; gunicorn's line would repeat it.
            "gunicorn.access": {"level": "CRITICAL", "handlers": [], "propagate": False},
        },
    }
