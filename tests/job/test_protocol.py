"""The rank <-> launcher lines: each writer's output read back by its parser, as mpirun
forwards it (tagged), and the one mapping of failure kinds to exit codes."""

import sysconfig
from types import SimpleNamespace

import pytest

from job.errors import ConfigError, PlatformError
from job.hints import KERAS3_UNDER_MWMS
from job.protocol import (
    ELISION,
    REPORT_LIMIT,
    FailureKind,
    Mark,
    elide,
    exit_code,
    mark_line,
    metrics_line,
    parse_mark,
    parse_metrics,
    parse_rank_failure,
    parse_stopped,
    rank_failure,
    stopped_line,
)


def test_a_metrics_line_reads_back_through_mpiruns_tag():
    line = metrics_line(3, {"loss": 0.1234567, "val_accuracy": 0.9, "samples_per_sec": 12345.6})
    assert line == "METRICS epoch=3 loss=0.123457 val_accuracy=0.9 samples_per_sec=12345.6"
    assert parse_metrics(f"[1,0]<stdout>:{line}") == {
        "epoch": 3.0,
        "loss": 0.123457,
        "val_accuracy": 0.9,
        "samples_per_sec": 12345.6,
    }
    assert parse_metrics("trainer: 2 rank(s)") is None


@pytest.mark.parametrize(
    "error, kind, code",
    [
        (ConfigError("channel train: row 7 has 3 columns"), FailureKind.CONFIG, 2),
        (PlatformError("Horovod sees 3 ranks"), FailureKind.CLUSTER, 3),
        (ValueError("bad\nvalue"), FailureKind.RANK, 1),
    ],
)
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


def raised_at(tmp_path, name: str, line: int, source: str, namespace: dict) -> BaseException:
    """The exception that `source`, put at `line` of a user's script `name`, raises."""
    script = tmp_path / name
    script.write_text("\n" * (line - 1) + source + "\n")
    try:
        exec(compile(script.read_text(), str(script), "exec"), namespace)
    except Exception as error:  # noqa: BLE001 - the test inspects whatever it raised
        return error
    raise AssertionError(f"{source} raised nothing")


def library_function(source: str, name: str):
    """A function defined in a file under the installed packages, as Keras' are: a frame of it
    is not the user's."""
    namespace: dict = {}
    path = f"{sysconfig.get_paths()['purelib']}/keras/src/trainers/trainer.py"
    exec(compile(source, path, "exec"), namespace)
    return namespace[name]


def test_keras3_under_mwms_keeps_the_cause_the_place_and_the_way_out(tmp_path):
    """The error a Keras 3 model raised under MultiWorkerMirroredStrategy on the TensorFlow 2.21
    image: 600 characters of tensor values between what failed and why."""
    values = ",\n       ".join("[" + ", ".join(["-0.0123456"] * 10) + "]" for _ in range(12))
    message = (
        f"Attempt to convert a value (PerReplica:{{\n  0: <tf.Tensor: shape=(64, 10), "
        f"dtype=float32, numpy=\narray([{values}], dtype=float32)>\n}}) with an "
        f"unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) "
        f"to a Tensor."
    )
    fit = library_function("def fit(data, epochs):\n    raise ValueError(data)\n", "fit")
    error = raised_at(
        tmp_path,
        "mnist_mwms.py",
        56,
        "model.fit(dataset, epochs=3)",
        {"model": SimpleNamespace(fit=fit), "dataset": message},
    )
    text = rank_failure(0, "algo-1", error).error
    assert len(message) > 1000 and len(text.encode()) <= REPORT_LIMIT
    assert text.startswith("ValueError: Attempt to convert a value (PerReplica:{ 0: <tf.Tensor")
    assert text.endswith(
        "with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) "
        "to a Tensor. (at mnist_mwms.py, line 56: model.fit(dataset, epochs=3)) "
        f"Hint: {KERAS3_UNDER_MWMS}"
    )
    assert text.count(ELISION) == 1


def test_a_long_multibyte_message_keeps_its_type_head_tail_and_place(tmp_path):
    message = "Zeile 7 enthält ungültige Zeichen: " + "ü日🙂" * 1000 + " – Spalte „Größe“ fehlt"
    error = raised_at(tmp_path, "daten.py", 3, "raise ValueError(message)", {"message": message})
    report = rank_failure(1, "algo-2", error)
    text = report.error
    assert len(text.encode()) <= REPORT_LIMIT
    assert text.startswith("ValueError: Zeile 7 enthält ungültige Zeichen: ü日🙂")
    assert text.endswith(" – Spalte „Größe“ fehlt (at daten.py, line 3: raise ValueError(message))")
    assert "\ufffd" not in text  # cut between characters, never inside one
    assert parse_rank_failure(f"[1,1]<stderr>:{report.line()}") == report


def test_an_error_without_a_users_frame_keeps_its_head_and_tail():
    never_raised = ValueError("first " + "x" * 3000 + " last")  # no traceback at all
    text = rank_failure(0, "algo-1", never_raised).error
    assert text.startswith("ValueError: first xxx") and text.endswith("xxx last")
    assert "(at " not in text and REPORT_LIMIT - 6 <= len(text.encode()) <= REPORT_LIMIT


def test_a_hint_is_found_in_the_part_of_the_message_that_is_cut():
    error = RuntimeError("step 3: " + "y" * 2000 + " OOM when allocating tensor " + "z" * 2000)
    text = rank_failure(0, "algo-1", error).error
    assert "OOM when allocating" not in text and "Hint: out of device memory" in text


@pytest.mark.parametrize(
    "text, limit, expected",
    [
        ("short", 5, "short"),
        ("abcdefghijklmnop", 11, f"abc{ELISION}nop"),
        ("ééééé", 9, f"é{ELISION}é"),  # 2-byte characters: one each side, not half of one
        ("日日日日", 11, f"日{ELISION}日"),
        ("🙂🙂🙂🙂", 12, f"🙂{ELISION}"),  # the tail's 3 bytes hold no whole emoji
        ("abc\udcffdef", 7, "abc?def"),  # a lone surrogate (from a file name) cannot be UTF-8
        ("abcdef", 3, "abc"),  # no room for the marker
    ],
)
def test_elide_keeps_both_ends_within_the_bytes(text, limit, expected):
    assert elide(text, limit) == expected
    assert len(elide(text, limit).encode()) <= limit


def test_exit_codes_of_every_kind():
    assert {kind: exit_code(kind, rank_code=7) for kind in FailureKind} == {
        FailureKind.CONFIG: 2,
        FailureKind.CLUSTER: 3,
        FailureKind.RANK: 7,
        FailureKind.HUNG: 4,
        FailureKind.STOPPED: 143,
        FailureKind.INTERNAL: 1,
    }
    assert exit_code(FailureKind.RANK, rank_code=0) == 1  # a failed rank never exits 0


def test_marks_read_back_and_unknown_ones_are_ignored():
    assert [parse_mark(f"[1,0]<stdout>:{mark_line(mark)}") for mark in Mark] == list(Mark)
    assert parse_mark("TRAIN-MARK someday") is None
    assert parse_mark("launcher: all 2 hosts ready") is None


def test_a_stop_line_reads_back():
    line = stopped_line(
        "checkpoint saved in /opt/ml/checkpoints; a restarted job resumes at epoch 4"
    )
    assert (
        parse_stopped(f"[1,0]<stdout>:trainer: {line}")
        == "checkpoint saved in /opt/ml/checkpoints; a restarted job resumes at epoch 4"
    )
    assert parse_stopped("trainer: 2 rank(s)") is None
