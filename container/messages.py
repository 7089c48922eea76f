"""The coordinator's messages (container.coordination): every line a leader and its workers
exchange is written by `Message.line` and read by `parse`, here and nowhere else.

    worker -> leader    HELLO <host>
    leader -> worker    KEY <the job's ssh public key>
    worker -> leader    READY <the worker sshd's host key; `-` for a data host>
    worker -> leader    FAIL <kind> <why it cannot get ready>
    both ways           PING                                   (every second, from HELLO on)
    data host -> leader ENDED <code> <kind> <reason as JSON>  (its script failed)
    leader -> worker    MEMORY                                 (a rank there died of SIGKILL)
    worker -> leader    OOM_KILLS <kills> <limit in bytes; `-` for none>, or OOM_KILLS -
    leader -> worker    EXIT <code> <kind> <reason as JSON>
    worker -> leader    BYE

MEMORY asks a worker what its memory cgroup counted (container.oom), which only it can read;
OOM_KILLS answers with the OOM kills counted and the limit, or `-` when it cannot read them.
FAIL's kind is the `FailureKind` of the error that stopped the worker (a port held there is the
user's: `config`), which the leader raises again (job.errors.error_of): every host of the job
then exits with the code the worker exits with. The kind alone travels, not a code, since the
kind decides the code (job.protocol.exit_code), and only a kind that an error carries is a FAIL.

A line is a verb, a space, and the verb's argument; PING, BYE and MEMORY have none. `parse` raises
`MalformedMessage` for any other line, saying what is wrong with it: the coordinator refuses
or drops the peer that sent it, and a worker names its leader. An outcome (EXIT, ENDED) is read
only if the launcher can end a job with it: a text reason, an exit code a process can have,
a kind exactly when the code is not 0; and ENDED only reports a failure. A FAIL's reason is
the rest of its line: a newline in it is sent as a space.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum

from container.failure import Outcome
from container.oom import CgroupMemory
from job.errors import error_of
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
    MEMORY = "MEMORY"
    OOM_KILLS = "OOM_KILLS"


_BARE = (Verb.PING, Verb.BYE, Verb.MEMORY)  # no argument
_OUTCOMES = (Verb.EXIT, Verb.ENDED)  # an Outcome as the argument
_SUCCESS = "ok"  # the kind written for a job that succeeded
_UNKNOWN = "-"  # OOM_KILLS of a cgroup that cannot be read, or its limit when it has none
_KILLS_AND_LIMIT = re.compile(r"(?P<kills>[0-9]{1,20}) (?P<limit>[0-9]{1,20}|-)")


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
    FAIL's reason; `kind` is FAIL's, the kind of the error it reports; `outcome` is EXIT's and
    ENDED's; `memory` is OOM_KILLS' (None: the worker cannot read its cgroup)."""

    verb: Verb
    text: str = ""
    outcome: Outcome | None = None
    memory: CgroupMemory | None = None
    kind: FailureKind | None = None

    def __post_init__(self) -> None:
        if (self.outcome is not None) != (self.verb in _OUTCOMES):
            raise ValueError(
                f"{self.verb.value} carries an outcome exactly when it is EXIT or ENDED"
            )
        if self.memory is not None and self.verb is not Verb.OOM_KILLS:
            raise ValueError(f"{self.verb.value} carries no memory cgroup; OOM_KILLS does")
        if (self.kind is not None) != (self.verb is Verb.FAIL):
            raise ValueError(f"{self.verb.value} carries a failure kind exactly when it is FAIL")
        if self.kind is not None:
            error_of(self.kind)  # a kind no error carries is refused here as by `parse`

    def line(self) -> str:
        """The message as one line (without its newline): a newline in a text (a FAIL's
        multi-line error) becomes a space, so the peer reads the whole of it."""
        if self.outcome is not None:
            kind = self.outcome.kind.value if self.outcome.kind else _SUCCESS
            reason = json.dumps(self.outcome.reason)
            return f"{self.verb.value} {self.outcome.exit_code} {kind} {reason}"
        if self.verb in _BARE:
            return self.verb.value
        if self.verb is Verb.OOM_KILLS:
            if self.memory is None:
                return f"{self.verb.value} {_UNKNOWN}"
            limit = _UNKNOWN if self.memory.limit is None else str(self.memory.limit)
            return f"{self.verb.value} {self.memory.oom_kills} {limit}"
        text = self.text.replace("\n", " ")
        if self.kind is not None:
            return f"{self.verb.value} {self.kind.value} {text}"
        return f"{self.verb.value} {text}"


PING = Message(Verb.PING)
BYE = Message(Verb.BYE)
MEMORY = Message(Verb.MEMORY)


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
    if verb is Verb.OOM_KILLS:
        return Message(verb, memory=_memory(argument, line))
    if verb is Verb.FAIL:
        kind, reason = _failure(argument, line)
        return Message(verb, reason, kind=kind)
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


def _failure(argument: str, line: str) -> tuple[FailureKind, str]:
    """The kind and the reason of a FAIL line's argument, `<kind> <reason>` (the reason may be
    empty: an error without a message is still reported by its kind)."""
    word, space, reason = argument.partition(" ")
    try:
        kind = FailureKind(word)
    except ValueError:
        raise MalformedMessage("FAIL without a failure kind", line, Verb.FAIL) from None
    try:
        error_of(kind)
    except ValueError:
        raise MalformedMessage("FAIL of a kind no error carries", line, Verb.FAIL) from None
    if not space:
        raise MalformedMessage("FAIL without its reason", line, Verb.FAIL)
    return kind, reason


def _memory(argument: str, line: str) -> CgroupMemory | None:
    """The cgroup of an OOM_KILLS line's argument: `<kills> <limit>` (each a count of bytes or
    kills; the limit `-` when there is none), or `-` when the worker cannot read it."""
    if argument == _UNKNOWN:
        return None
    found = _KILLS_AND_LIMIT.fullmatch(argument)
    if found is None:
        raise MalformedMessage("not an OOM kill count and a limit", line, Verb.OOM_KILLS)
    limit = None if found["limit"] == _UNKNOWN else int(found["limit"])
    return CgroupMemory(int(found["kills"]), limit)
