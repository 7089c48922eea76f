"""Property: the launcher's parsers of the lines ranks print (job.protocol) answer "not such a
line" or a value for any line at all, never an exception: a user's script prints what it
likes, and mpirun forwards it to the launcher's readers (container.failure, the watchdog).
And each writer's line reads back as what was written."""

from __future__ import annotations

from hypothesis import example
from hypothesis import strategies as st

from job.protocol import (
    ACTIVE_MARKER,
    FAILURE_MARKER,
    METRICS_PREFIX,
    PROGRESS_MARKER,
    STOPPED_MARKER,
    TIME_MARKER,
    FailureKind,
    Mark,
    RankFailure,
    active_line,
    parse_active,
    parse_mark,
    parse_metrics,
    parse_progress,
    parse_rank_failure,
    parse_stopped,
    progress_line,
)
from tests.fuzzing import fuzz

MARKERS = [
    ACTIVE_MARKER,
    FAILURE_MARKER,
    METRICS_PREFIX,
    PROGRESS_MARKER,
    STOPPED_MARKER,
    TIME_MARKER,
]
pieces = st.one_of(
    st.sampled_from(
        MARKERS
        + [
            " ",
            "=",
            ":",
            "[1,0]<stdout>:",
            "step=",
            "cpu=",
            "rank=",
            "host=",
            "kind=",
            "epoch=",
            "loss=",
            "config",
            "\u0661",
            "\uff11",
            "1" * 5000,
            "9" * 30,
            ".5",
            "nan",
            "\x00",
            "\ud800",
            "\t",
        ]
    ),
    st.integers(-5, 10**6).map(str),
    st.text(max_size=6),
)
lines = st.lists(pieces, max_size=10).map("".join)


@example(line=f"{PROGRESS_MARKER} step={'1' * 5000}")  # ValueError: int past 4300 digits
@example(line=f"{FAILURE_MARKER} rank={'1' * 5000} host=algo-1 kind=config: E")
@fuzz("job.protocol: rank output lines", max_examples=800, line=lines)
def test_no_line_breaks_a_parser(line):
    progress, step = parse_progress(line)
    assert step is None or (progress and isinstance(step, int) and step >= 0)
    assert parse_active(line) is None or parse_active(line) >= 0
    assert parse_mark(line) is None or isinstance(parse_mark(line), Mark)
    assert parse_stopped(line) is None or isinstance(parse_stopped(line), str)
    metrics = parse_metrics(line)
    assert metrics is None or all(isinstance(value, float) for value in metrics.values())
    failure = parse_rank_failure(line)
    assert failure is None or (isinstance(failure.kind, FailureKind) and failure.rank >= 0)


host_names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)


@fuzz(
    "job.protocol: lines written and read back",
    max_examples=300,
    step=st.none() | st.integers(0, 10**15),
    cores=st.floats(0, 1000),
    failure=st.builds(
        RankFailure,
        st.integers(0, 10**6),
        host_names,
        st.sampled_from(FailureKind),
        st.text(max_size=30).map(lambda text: " ".join(text.split())),
    ),
    tag=st.sampled_from(["", "[1,0]<stdout>:", "[1,12]<stderr>:"]),
)
def test_every_line_reads_back(step, cores, failure, tag):
    assert parse_progress(tag + progress_line(step)) == (True, step)
    assert parse_active(tag + active_line(cores)) == round(cores, 2)
    assert parse_rank_failure(tag + failure.line()) == failure
