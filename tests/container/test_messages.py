"""The coordinator's messages (container.messages): each written as the protocol's one line and
read back the same; a line that is no message is a MalformedMessage that says what is wrong."""

import pytest

from container.failure import Outcome
from container.messages import BYE, MEMORY, PING, MalformedMessage, Message, Verb, parse
from container.oom import CgroupMemory
from job.protocol import FailureKind

FAILED = Outcome.failed(FailureKind.CONFIG, 'bad "lr"\nsee the README', 2)
GOLDEN = [
    (Message(Verb.HELLO, "algo-2"), "HELLO algo-2"),
    (Message(Verb.KEY, "ssh-ed25519 AAAA job"), "KEY ssh-ed25519 AAAA job"),
    (Message(Verb.READY, "ssh-ed25519 BBBB host"), "READY ssh-ed25519 BBBB host"),
    (Message(Verb.READY, "-"), "READY -"),
    (
        Message(Verb.FAIL, "sshd rejected its configuration", kind=FailureKind.CLUSTER),
        "FAIL cluster sshd rejected its configuration",
    ),
    (Message(Verb.FAIL, "port 22 is held", kind=FailureKind.CONFIG), "FAIL config port 22 is held"),
    (Message(Verb.FAIL, " x ", kind=FailureKind.INTERNAL), "FAIL internal  x "),  # spaces kept
    (Message(Verb.FAIL, kind=FailureKind.CONFIG), "FAIL config "),  # an error with no message
    (PING, "PING"),
    (BYE, "BYE"),
    (Message(Verb.EXIT, outcome=Outcome.success()), 'EXIT 0 ok ""'),
    (Message(Verb.EXIT, outcome=FAILED), 'EXIT 2 config "bad \\"lr\\"\\nsee the README"'),
    (Message(Verb.ENDED, outcome=FAILED), 'ENDED 2 config "bad \\"lr\\"\\nsee the README"'),
    (MEMORY, "MEMORY"),
    (Message(Verb.OOM_KILLS, memory=CgroupMemory(1, 3 * 2**30)), "OOM_KILLS 1 3221225472"),
    (Message(Verb.OOM_KILLS, memory=CgroupMemory(0, None)), "OOM_KILLS 0 -"),  # no limit
    (Message(Verb.OOM_KILLS), "OOM_KILLS -"),  # its cgroup cannot be read
]


@pytest.mark.parametrize(("message", "line"), GOLDEN, ids=[line[:12] for _, line in GOLDEN])
def test_each_message_is_its_one_line_and_reads_back(message, line):
    assert message.line() == line
    assert parse(line) == message


def test_a_multi_line_reason_is_sent_on_one_line_whole():
    """sshd's configuration check prints several lines; the leader reads the whole reason."""
    message = Message(
        Verb.FAIL,
        "sshd rejected its configuration: line 3: bad\nline 9: worse",
        kind=FailureKind.CLUSTER,
    )
    assert message.line() == (
        "FAIL cluster sshd rejected its configuration: line 3: bad line 9: worse"
    )
    assert parse(message.line()).text.endswith("line 9: worse")


@pytest.mark.parametrize(
    ("line", "problem", "verb"),
    [
        ("GET / HTTP/1.1", "not a message of the protocol: 'GET / HTTP/1.1'", None),
        ("hello algo-2", "not a message of the protocol", None),
        ("HELLO", "HELLO without its argument: 'HELLO'", Verb.HELLO),
        ("HELLO   ", "HELLO without its argument", Verb.HELLO),
        ("READY ", "READY without its argument", Verb.READY),
        ("PING now", "PING takes nothing after it: 'PING now'", Verb.PING),
        ("EXIT 1 config", "not an outcome: 'EXIT 1 config'", Verb.EXIT),
        ('EXIT 256 config "x"', "not an outcome", Verb.EXIT),
        ('EXIT 0 config "x"', "not an outcome", Verb.EXIT),
        ("EXIT 1 config [1]", "not an outcome", Verb.EXIT),
        ('EXIT 1 bogus "x"', "not an outcome", Verb.EXIT),
        ("ENDED 1 config " + "[" * 5000 + "]" * 5000, "an outcome nested too deeply", Verb.ENDED),
        ('ENDED 0 ok "fine"', "ENDED without a failure", Verb.ENDED),
        ("FAIL", "FAIL without its argument: 'FAIL'", Verb.FAIL),
        # the FAIL of a launcher from before FAIL carried a kind
        (
            "FAIL sshd rejected it",
            "FAIL without a failure kind: 'FAIL sshd rejected it'",
            Verb.FAIL,
        ),
        ("FAIL  config x", "FAIL without a failure kind", Verb.FAIL),
        ("FAIL Config x", "FAIL without a failure kind", Verb.FAIL),
        ("FAIL ok x", "FAIL without a failure kind", Verb.FAIL),
        ("FAIL rank x", "FAIL of a kind no error carries: 'FAIL rank x'", Verb.FAIL),
        ("FAIL hung x", "FAIL of a kind no error carries", Verb.FAIL),
        ("FAIL stopped x", "FAIL of a kind no error carries", Verb.FAIL),
        ("FAIL config", "FAIL without its reason: 'FAIL config'", Verb.FAIL),
        ("MEMORY now", "MEMORY takes nothing after it", Verb.MEMORY),
        ("OOM_KILLS", "OOM_KILLS without its argument", Verb.OOM_KILLS),
        ("OOM_KILLS 1", "not an OOM kill count and a limit: 'OOM_KILLS 1'", Verb.OOM_KILLS),
        ("OOM_KILLS -1 5", "not an OOM kill count and a limit", Verb.OOM_KILLS),
        ("OOM_KILLS 1 max", "not an OOM kill count and a limit", Verb.OOM_KILLS),
        ("OOM_KILLS 1 2 3", "not an OOM kill count and a limit", Verb.OOM_KILLS),
        ("OOM_KILLS \u00b2 5", "not an OOM kill count and a limit", Verb.OOM_KILLS),
        ("OOM_KILLS - -", "not an OOM kill count and a limit", Verb.OOM_KILLS),
    ],
)
def test_a_line_that_is_no_message_says_what_is_wrong(line, problem, verb):
    with pytest.raises(MalformedMessage, match="^" + problem.replace("[", r"\[")) as raised:
        parse(line)
    assert raised.value.verb is verb
    assert raised.value.line == line


def test_an_outcome_comes_with_exit_and_ended_only():
    with pytest.raises(ValueError, match="carries an outcome exactly when it is EXIT or ENDED"):
        Message(Verb.FAIL, outcome=FAILED)
    with pytest.raises(ValueError, match="carries an outcome exactly when it is EXIT or ENDED"):
        Message(Verb.EXIT)


def test_a_failure_kind_comes_with_fail_only_and_is_one_an_error_carries():
    """What the leader could not read back (parse) is never written either."""
    with pytest.raises(ValueError, match="FAIL carries a failure kind exactly when it is FAIL"):
        Message(Verb.FAIL, "why")
    with pytest.raises(ValueError, match="READY carries a failure kind exactly when it is FAIL"):
        Message(Verb.READY, "key", kind=FailureKind.CONFIG)
    with pytest.raises(ValueError, match="no error carries the failure kind 'rank'"):
        Message(Verb.FAIL, "why", kind=FailureKind.RANK)


def test_a_memory_cgroup_comes_with_oom_kills_only():
    with pytest.raises(ValueError, match="PING carries no memory cgroup; OOM_KILLS does"):
        Message(Verb.PING, memory=CgroupMemory(1, None))
