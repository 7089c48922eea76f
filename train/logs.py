"""The trainer side's log: one stdlib logger, whose lines the leader alone prints.

What the built-in trainer says (`trainer: ...`, the RESULT line), what the helpers a user's
script imports say (`checkpoints: ...` from train.resumable, `launcher: ...` from
train.keras_script, which speaks for the launcher inside the script's process) and a data
host's `data service: ...` line. Each message carries its speaker's prefix, as these lines
always have: users' habits, the bench and the tests read them. How a line is written (info to
stdout, warnings to stderr, one flushed write each, no propagation) is job.console's, shared
with the launcher's log (container.logs).

Who prints is decided here, once, for every line: the leader, by train.rank.world_rank, the
answer RankContext.is_leader (`Trainer.leader`) also gives. Every rank of a job would say the
same, so a call site logs and never asks.

In a user's script's process this logger is a library's: it adds no handler to the root
logger and calls no basicConfig, so the script's own logging stays as the script set it, and
like every library's logger it follows what the script does to logging (logging.config's
default disables the loggers that exist). So the lines the launcher reads are not written
here: the protocol of job.protocol (progress, marks, metrics, a stop, a failure report, the
pulse) goes through train.rank and train.activity, whatever the script does to logging.
"""

from __future__ import annotations

import logging

from job.console import console_logger
from train.rank import world_rank


def _from_the_leader(record: logging.LogRecord) -> bool:
    return world_rank() == 0


log = console_logger(__name__)
log.addFilter(_from_the_leader)
