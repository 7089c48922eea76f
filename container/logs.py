"""The launcher's log: one stdlib logger, `launcher`, whose every line reads `launcher: <message>`.

The line format is a contract, not a taste: users grep for `launcher: job completed`, the
SageMaker metric definitions and the bench read these lines, and so do the tests. So a record
is written as the prefix and its message, nothing else (CloudWatch stamps each line with its
time; a level would change lines that regexes match).

Where a line goes is its level: info to stdout, where the ranks' output that mpirun forwards
goes too (container.supervisor), warnings and errors to stderr. So a line's level follows the
stream it has always gone to: news that reads like a warning but has always been on stdout (a
restart, an interface not found) stays at info, where readers of stdout find it.

Each record is written in one write and flushed at once, so it stays whole among lines other
threads write and lands in order with the forwarded output, which goes through the same
`sys.stdout`. The stream is looked up when a record is written, not when the logger is set up:
whoever swaps `sys.stdout` (pytest's capture, a redirect) gets the launcher's lines with the
rest. The logger does not propagate: a handler that something else put on the root logger must
not print a line twice.
"""

from __future__ import annotations

import logging
import sys

PREFIX = "launcher: "


class _ConsoleHandler(logging.Handler):
    """A record to the current stdout (info) or stderr (warnings, errors), flushed."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except RecursionError:  # as logging.StreamHandler: a recursion is a bug, not an I/O error
            raise
        except Exception:
            self.handleError(record)


def _launcher_logger() -> logging.Logger:
    logger = logging.getLogger("launcher")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = _ConsoleHandler()
    handler.setFormatter(logging.Formatter(PREFIX + "%(message)s"))
    logger.addHandler(handler)
    return logger


log = _launcher_logger()
