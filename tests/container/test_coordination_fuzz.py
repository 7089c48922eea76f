"""Property: whatever bytes a peer sends the coordinator, the leader refuses that peer cleanly
(closes its connection, records why) or takes what it said; it never dies of an exception
("internal error serving ..."), never waits past its deadlines, and keeps accepting workers.

The real leader on a real loopback socket: strangers (127.0.0.9) and a data host (127.0.0.2,
whose name resolves to itself) that says HELLO and then anything. The message codec
(container.messages), which those lines reach (a data host's ENDED, the leader's EXIT, a
worker's FAIL), is fuzzed by itself for volume.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest
from hypothesis import example
from hypothesis import strategies as st

from container.coordination import MAX_LINE, Leader, PeerState, follow_leader
from container.failure import Outcome
from container.messages import MalformedMessage, Message, Verb, parse
from job.errors import error_of
from job.protocol import FailureKind
from tests.fuzzing import fuzz
from tests.waiting import eventually

LEADER, HOST, STRANGER = "127.0.0.1", "127.0.0.2", "127.0.0.9"
DEEP = "[" * 5000 + "]" * 5000
KINDS = [kind.value for kind in FailureKind] + ["ok"]
ERROR_KINDS = [FailureKind.CONFIG, FailureKind.CLUSTER, FailureKind.INTERNAL]  # a FAIL's

texts = st.one_of(
    st.text(max_size=20),
    st.text(
        st.sampled_from(["a", "1", " ", "\x00", "\r", "\t", "é", "\ud800", '"', "\\"]), max_size=10
    ),
)
reasons = st.one_of(
    texts.map(json.dumps),
    st.sampled_from([DEEP, "[1]", "null", "3", "NaN", '{"a": 1}', '"unclosed', "", '"x" trailing']),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | texts,
        lambda inner: st.lists(inner, max_size=3),
        max_leaves=6,
    ).map(json.dumps),
)
codes = st.one_of(
    st.integers(-300, 300).map(str),
    st.sampled_from(
        [
            "",
            "0",
            "1",
            "2",
            "143",
            "255",
            "256",
            "-1",
            "1" * 5000,
            "99999999999999999999",
            "1.0",
            " 1",
            "+1",
            "\u0661",
            "1_0",
        ]
    ),
)
outcome_lines = st.builds(
    lambda verb, code, kind, reason, gaps: (
        verb + gaps[0] + code + gaps[1] + kind + gaps[2] + reason
    ),
    st.sampled_from(["ENDED ", "EXIT "]),
    codes,
    st.sampled_from(KINDS) | texts,
    reasons,
    st.tuples(*[st.sampled_from([" ", " ", "", "  "])] * 3),
)


def assert_well_formed(outcome: Outcome) -> None:
    """What the launcher can end a job with: a text reason, an exit code, and a kind exactly
    when the code says it failed."""
    assert isinstance(outcome.reason, str)
    assert isinstance(outcome.exit_code, int) and 0 <= outcome.exit_code <= 255
    assert (outcome.kind is None) == (outcome.exit_code == 0)


@example(line=f"ENDED 1 config {DEEP}")  # RecursionError: "internal error serving 127.0.0.2"
@example(line="ENDED 1 config [1]")  # a reason that is not text
@example(line='ENDED 99999999999999999999 config "x"')  # no process exits with that code
@example(line='ENDED 0 ok "x"')  # a data host's failure that would end the job with 0
@fuzz("coordinator: ENDED/EXIT outcome codec", max_examples=1000, line=outcome_lines | texts)
def test_an_outcome_line_is_read_whole_or_refused(line):
    try:
        message = parse(line)
    except MalformedMessage:
        return
    if message.outcome is not None:
        assert_well_formed(message.outcome)
        assert message.verb is Verb.EXIT or message.outcome.kind is not None  # ENDED: a failure


outcomes = st.one_of(
    st.just(Outcome.success()),
    st.builds(Outcome.failed, st.sampled_from(FailureKind), texts, st.integers(1, 255)),
)


@fuzz(
    "coordinator: outcome round trip",
    max_examples=300,
    outcome=outcomes,
    verb=st.sampled_from([Verb.EXIT, Verb.ENDED]),
)
def test_every_outcome_the_leader_sends_reads_back_the_same(outcome, verb):
    if verb is Verb.ENDED and outcome.kind is None:
        return  # a data host says ENDED only when its script failed
    message = Message(verb, outcome=outcome)
    assert parse(message.line()) == message


fail_lines = st.builds(
    lambda kind, gap, reason: "FAIL " + kind + gap + reason,
    st.sampled_from(KINDS) | texts,
    st.sampled_from([" ", " ", "", "  "]),
    texts,
)


@example(line="FAIL rank x")  # a kind that no error carries: the leader could raise none
@example(line="FAIL config")  # no reason after the kind
@example(line="FAIL sshd failed")  # no kind: a launcher from before FAIL carried one
@fuzz("coordinator: FAIL codec", max_examples=300, line=fail_lines | texts)
def test_a_fail_line_is_read_with_a_kind_an_error_carries_or_refused(line):
    """The leader raises an error of the kind a FAIL names (job.errors.error_of): a kind it
    could not raise is refused here, not found when a worker cannot get ready."""
    try:
        message = parse(line)
    except MalformedMessage:
        return
    if message.verb is Verb.FAIL:
        assert error_of(message.kind).kind is message.kind
        assert message.line() == line.replace("\n", " ")  # all of it was read, as it was


@fuzz(
    "coordinator: FAIL round trip",
    max_examples=200,
    kind=st.sampled_from(ERROR_KINDS),
    reason=texts.filter(lambda reason: "\n" not in reason),
)
def test_every_fail_a_worker_sends_reads_back_the_same(kind, reason):
    message = Message(Verb.FAIL, reason, kind=kind)
    assert parse(message.line()) == message


def test_the_fail_kinds_are_those_errors_carry():
    for kind in FailureKind:
        if kind in ERROR_KINDS:
            assert error_of(kind).kind is kind
        else:
            with pytest.raises(ValueError):
                error_of(kind)


def raw_line(text: str) -> bytes:
    return text.encode(errors="surrogatepass")


# Lines as a peer might send them: the protocol's verbs with anything after them, the
# outcome lines above, bytes that are not UTF-8, a line past MAX_LINE.
peer_lines = st.one_of(
    st.builds(
        lambda verb, rest: raw_line(verb + rest),
        st.sampled_from(
            ["HELLO ", "READY ", "FAIL ", "PING", "BYE", "KEY ", "READY", "hello ", "EXIT "]
        ),
        texts,
    ),
    outcome_lines.map(raw_line),
    fail_lines.map(raw_line),
    st.binary(max_size=30).map(lambda data: data.replace(b"\n", b"")),
    st.just(b"x" * (MAX_LINE + 1)),
)


def connect(port: int, source: str) -> socket.socket:
    connection = socket.create_connection((LEADER, port), timeout=5, source_address=(source, 0))
    connection.settimeout(5)
    return connection


def send_then_hear(connection: socket.socket, data: bytes) -> bytes:
    """Send `data`, end our side, and return all the leader said until it closed; fails the
    test when the leader keeps the connection open 5 s after that."""
    try:
        connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the leader cut us off while we were still sending (a line past MAX_LINE)
    heard = b""
    while True:
        try:
            chunk = connection.recv(65536)
        except ConnectionResetError:
            return heard
        if not chunk:
            return heard
        heard += chunk


def no_internal_error(capsys) -> None:
    output = capsys.readouterr().out
    assert "internal error" not in output and "Traceback" not in output, output


@pytest.fixture
def leader():
    leader = Leader(
        address=LEADER,
        port=0,
        workers=[HOST],
        public_key="ssh-ed25519 AAAA job",
        heartbeat_timeout=5,
    )
    yield leader
    leader.close()


@example(first=b"HELLO 127.0.0.2", rest=[b"READY key"])  # the right name from the wrong address
@fuzz(
    "coordinator: a stranger's bytes, over loopback",
    max_examples=150,
    first=peer_lines,
    rest=st.lists(peer_lines, max_size=3),
)
def test_a_stranger_gets_nothing_and_the_workers_still_get_in(leader, capsys, first, rest):
    port = leader.server.getsockname()[1]
    with connect(port, STRANGER) as connection:
        assert send_then_hear(connection, b"\n".join([first, *rest]) + b"\n") == b""
    no_internal_error(capsys)
    assert not leader.roster.peers


def test_a_worker_gets_in_after_the_strangers(leader, capsys):
    """After strangers were refused (the fuzzing above, here the one it found first), a worker
    is still let in and gets the key and the outcome."""
    port = leader.server.getsockname()[1]
    for _ in range(20):
        with connect(port, STRANGER) as connection:
            assert send_then_hear(connection, b"HELLO 127.0.0.2\nREADY key\n") == b""
    results = {}

    def follow():
        results[HOST] = follow_leader(
            LEADER,
            port,
            HOST,
            address=HOST,
            leader_timeout=10,
            heartbeat_timeout=5,
            on_key=lambda key: "hostkey",
        )

    worker = threading.Thread(target=follow)
    worker.start()
    assert leader.wait_ready(timeout=10) == {HOST: "hostkey"}
    leader.finish(Outcome.success())
    worker.join(timeout=10)
    assert results == {HOST: Outcome.success()}
    no_internal_error(capsys)


def settled(leader: Leader, host: str) -> bool:
    with leader.roster.condition:
        peer = leader.roster.peers.get(host)
        return peer is not None and peer.state is not PeerState.JOINED


@example(answer=b"x" * (MAX_LINE + 1), later=[])  # dropped, unrecorded: a wait to host_timeout
@example(answer=b"READY key", later=[raw_line(f"ENDED 1 config {DEEP}")])
@example(answer=b"FAIL config port 6100 is held", later=[])  # the user's: its kind is kept
@example(answer=b"READY key", later=[b"ENDED 1 config [1]"])
@example(answer=b"READY key", later=[b'ENDED 0 ok "fine"'])
@fuzz(
    "coordinator: a data host's lines after HELLO, over loopback",
    max_examples=150,
    answer=peer_lines,
    later=st.lists(peer_lines, max_size=4),
)
def test_what_a_data_host_says_is_taken_or_it_is_dropped(capsys, answer, later):
    leader = Leader(
        address=LEADER,
        port=0,
        workers=[],
        data_hosts=(HOST,),
        public_key="ssh-ed25519 AAAA job",
        heartbeat_timeout=5,
    )
    try:
        with connect(leader.server.getsockname()[1], HOST) as connection:
            heard = send_then_hear(
                connection, b"\n".join([b"HELLO " + HOST.encode(), answer, *later]) + b"\n"
            )
        assert heard.startswith(b"KEY ssh-ed25519 AAAA job\n")
        eventually(
            lambda: settled(leader, HOST),  # the leader closed the connection: decided
            "the leader never decided about the data host",
            5,
            every=0.01,
        )
        no_internal_error(capsys)
        said = b"\n".join([answer, *later]).decode(errors="replace")
        with leader.roster.condition:
            peer = leader.roster.peers[HOST]
            if peer.ended is not None:
                assert_well_formed(peer.ended)
                assert peer.ended.kind is not None  # ENDED reports a failure
            ready = bool(peer.host_key)
            assert ready or peer.state is PeerState.FAILED  # a refusal the job's failure names
            if peer.state is PeerState.FAILED and peer.failure is not FailureKind.CLUSTER:
                assert said.startswith(f"FAIL {peer.failure.value} ")  # its own, its answer
            assert not ready or peer.host_key in said
            if ready and peer.state is not PeerState.LEFT:
                # after READY every way out but BYE is the data host ending or being lost:
                # either way the training must be stopped
                assert leader.abort.is_set()
    finally:
        leader.close()
