"""The coordinator's messages (container.coordination): every line a leader and its workers
exchange is written by `Message.line` and read by `parse`, here and nowhere else.

    worker -> leader    HELLO <host>
    leader -> worker    KEY <the job's ssh public key>
    worker -> leader    READY <the worker sshd's host key; `-` for a data host>
    worker -> leader    FAIL <why it cannot get ready>
    both ways           PING                                   (every second, from HELLO on)
    data host -> leader ENDED <code> <kind> <reason as JSON>  (its script failed)
    leader -> worker    EXIT <code> <kind> <reason as JSON>
    worker -> leader    BYE

A line is a verb, a space, and the verb's argument; PING and BYE have none. `parse` raises
`MalformedMessage` for any other line, saying what is wrong with it: the coordinator refuses
or drops the peer that sent it, and a worker names its leader. An outcome (EXIT, ENDED) is read
only if the launcher can end a job with it: a text reason, an exit code a process can have,
a kind exactly when the code is not 0; and ENDED only reports a failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from container.failure import Outcome
from job.protocol import FailureKind


class Verb(Enum):
    HELLO = "HELLO"
    KEY = "KEY"
    READY = "READY"
    FAIL = "FAIL"
    PING = "PING"
    ENDED = "ENDED"
    EXIT = "EXIT"
    BYE = "BYE"


_BARE = (Verb.PING, Verb.BYE)  # no argument
_OUTCOMES = (Verb.EXIT, Verb.ENDED)  # an Outcome as the argument
_SUCCESS = "ok"  # the kind written for a job that succeeded


class MalformedMessage(ValueError):
    """A line that is no message of the protocol. `verb` is the verb the line starts with, if
    it starts with one: a broken ENDED from a data host ends that host's part in the job, while
    a worker's stray line after it is ready is ignored."""

    def __init__(self, problem: str, line: str, verb: Verb | None = None):
        super().__init__(f"{problem}: {line[:200]!r}")
        self.line = line
        self.verb = verb


@dataclass(frozen=True)
class Message:
    """One line of the protocol: `text` is HELLO's host, KEY's public key, READY's host key or
    FAIL's reason; `outcome` is EXIT's and ENDED's."""

    verb: Verb
    text: str = ""
    outcome: Outcome | None = None

    def __post_init__(self) -> None:
        if (self.outcome is not None) != (self.verb in _OUTCOMES):
            raise ValueError(
                f"{self.verb.value} carries an outcome exactly when it is EXIT or ENDED"
            )

    def line(self) -> str:
        """The message as one line (without its newline): a newline in a text (a FAIL's
        multi-line error) becomes a space, so the peer reads the whole of it."""
        if self.outcome is not None:
            kind = self.outcome.kind.value if self.outcome.kind else _SUCCESS
            reason = json.dumps(self.outcome.reason)
            return f"{self.verb.value} {self.outcome.exit_code} {kind} {reason}"
        if self.verb in _BARE:
            return self.verb.value
        text = self.text.replace("\n", " ")
        return f"{self.verb.value} {text}"


PING = Message(Verb.PING)
BYE = Message(Verb.BYE)


def parse(line: str) -> Message:
    """The message `line` (without its newline) holds; MalformedMessage if it holds none."""
    word, space, argument = line.partition(" ")
    try:
        verb = Verb(word)
    except ValueError:
        raise MalformedMessage("not a message of the protocol", line) from None
    if verb in _BARE:
        if space:
            raise MalformedMessage(f"{verb.value} takes nothing after it", line, verb)
        return Message(verb)
    if not space:
        raise MalformedMessage(f"{verb.value} without its argument", line, verb)
    if verb in _OUTCOMES:
        return Message(verb, outcome=_outcome(verb, argument, line))
    if verb in (Verb.HELLO, Verb.READY):  # a name and a key: spaces around them are no part
        argument = argument.strip()
        if not argument:
            raise MalformedMessage(f"{verb.value} without its argument", line, verb)
    return Message(verb, argument)


def _outcome(verb: Verb, argument: str, line: str) -> Outcome:
    """The Outcome of an EXIT or ENDED line's argument, `<code> <kind> <reason as JSON>`."""
    try:
        code, kind, reason = argument.split(" ", 2)
        text = json.loads(reason)
        outcome = Outcome(None if kind == _SUCCESS else FailureKind(kind), text, int(code))
    except RecursionError:  # valid JSON nested past the parser's depth
        raise MalformedMessage("an outcome nested too deeply", line, verb) from None
    except ValueError:  # too few fields, a kind or code that is none, a reason not JSON
        raise MalformedMessage("not an outcome", line, verb) from None
    if (
        not isinstance(text, str)
        or not 0 <= outcome.exit_code <= 255
        or (outcome.kind is None) != (outcome.exit_code == 0)
    ):
        raise MalformedMessage("not an outcome", line, verb)
    if verb is Verb.ENDED and outcome.kind is None:  # a data host only says ENDED on failure
        raise MalformedMessage("ENDED without a failure", line, verb)
    return outcome
