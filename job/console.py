"""The console logger both sides print through: the launcher's (container.logs) and the
trainer's (train.logs), so that their lines are written alike.

The line format is a contract, not a taste: users grep the job's log, SageMaker's metric
definitions, the bench and the tests read its lines. So a record is written as its logger's
prefix and its message, nothing else (CloudWatch stamps each line with its time; a level would
change lines that regexes match).

Where a line goes is its level: info to stdout, warnings and errors to stderr. So a line's
level follows the stream it has always gone to: news that reads like a warning but has always
been on stdout stays at info, where readers of stdout find it.

Each record is written in one write and flushed at once, so it stays whole among lines other
threads write (mpirun tags each write of a rank, so a split line would be torn) and lands in
order with other output written through the same `sys.stdout`. The stream is looked up when a
record is written, not when the logger is set up: whoever swaps `sys.stdout` (pytest's capture,
a redirect) gets these lines with the rest. The logger does not propagate: a handler that
something else put on the root logger (a user's script's own logging, in the trainer's case)
must not print a line twice, and that logging is left as it was.
"""

from __future__ import annotations

import logging
import sys


class ConsoleHandler(logging.Handler):
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


def console_logger(name: str, prefix: str = "") -> logging.Logger:
    """The logger `name`, writing each record as `prefix` and its message (at info and above)
    through its own ConsoleHandler, and to nothing else."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = ConsoleHandler()
    handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    logger.addHandler(handler)
    return logger
