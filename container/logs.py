"""The launcher's log: one stdlib logger, `launcher`, whose every line reads `launcher: <message>`.

Users grep for `launcher: job completed`, and the SageMaker metric definitions, the bench and
the tests read these lines. How a line is written (info to stdout, where the ranks' output that
mpirun forwards goes too (container.supervisor), warnings and errors to stderr; one flushed
write per line, to the stream of the moment; no propagation) is job.console's, shared with the
trainer's log (train.logs). So a restart or an interface not found, news that has always been
on stdout, stays at info.
"""

from __future__ import annotations

from job.console import console_logger

log = console_logger("launcher", "launcher: ")
"""The launcher's log lines: the exact text, the stream, and one write per line."""
