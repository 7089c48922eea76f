"""The rank <-> launcher lines: each writer's output read back by its parser, as mpirun
forwards it (tagged), and the one mapping of failure kinds to exit codes."""

import pytest

from job.errors import ConfigError, PlatformError
from job.protocol import (FailureKind, Mark, exit_code, mark_line, metrics_line,
                                parse_mark, parse_metrics, parse_rank_failure, parse_stopped,
                                rank_failure, stopped_line)


def test_a_metrics_line_reads_back_through_mpiruns_tag():
    line = metrics_line(3, {"loss": 0.1234567, "val_accuracy": 0.9, "samples_per_sec": 12345.6})
    assert line == "METRICS epoch=3 loss=0.123457 val_accuracy=0.9 samples_per_sec=12345.6"
    assert parse_metrics(f"[1,0]<stdout>:{line}") == {
        "epoch": 3.0, "loss": 0.123457, "val_accuracy": 0.9, "samples_per_sec": 12345.6}
    assert parse_metrics("trainer: 2 rank(s)") is None


@pytest.mark.parametrize("error, kind, code", [
    (ConfigError("channel train: row 7 has 3 columns"), FailureKind.CONFIG, 2),
    (PlatformError("Horovod sees 3 ranks"), FailureKind.CLUSTER, 3),
    (ValueError("bad\nvalue"), FailureKind.RANK, 1),
])
def test_a_rank_failure_report_carries_its_kind(error, kind, code):
    report = rank_failure(5, "algo-3", error)
    read = parse_rank_failure(f"[1,5]<stderr>:{report.line()}")
    assert read == report and read.kind is kind and exit_code(read.kind) == code
    assert "\n" not in report.line()


def test_a_bare_assert_is_reported_with_its_file_line_and_source(tmp_path):
    script = tmp_path / "check_rows.py"
    script.write_text("def check(rows):\n    assert len(rows) == 3\n")
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    try:
        namespace["check"]([1, 2])
    except AssertionError as error:
        report = rank_failure(1, "algo-2", error)
    assert report.error == "AssertionError (at check_rows.py, line 2: assert len(rows) == 3)"
    assert report.kind is FailureKind.RANK


def test_exit_codes_of_every_kind():
    assert {kind: exit_code(kind, rank_code=7) for kind in FailureKind} == {
        FailureKind.CONFIG: 2, FailureKind.CLUSTER: 3, FailureKind.RANK: 7,
        FailureKind.HUNG: 4, FailureKind.STOPPED: 143, FailureKind.INTERNAL: 1}
    assert exit_code(FailureKind.RANK, rank_code=0) == 1  # a failed rank never exits 0


def test_marks_read_back_and_unknown_ones_are_ignored():
    assert [parse_mark(f"[1,0]<stdout>:{mark_line(mark)}") for mark in Mark] == list(Mark)
    assert parse_mark("TRAIN-MARK someday") is None
    assert parse_mark("launcher: all 2 hosts ready") is None


def test_a_stop_line_reads_back():
    line = stopped_line("checkpoint saved in /opt/ml/checkpoints; a restarted job resumes at epoch 4")
    assert parse_stopped(f"[1,0]<stdout>:trainer: {line}") == \
        "checkpoint saved in /opt/ml/checkpoints; a restarted job resumes at epoch 4"
    assert parse_stopped("trainer: 2 rank(s)") is None
