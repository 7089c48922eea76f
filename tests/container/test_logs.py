"""The launcher's log lines: the exact text, the stream, and one write per line."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

from container.logs import log
from tests.conftest import ROOT


class Writes(io.StringIO):
    """A stream that remembers each write and each flush, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)

    def flush(self) -> None:
        self.calls.append("<flush>")
        super().flush()


def replaced_streams(monkeypatch) -> tuple[Writes, Writes]:
    """(stdout, stderr): sys.stdout and sys.stderr replaced for the rest of this test, since
    the logger writes to whatever streams are sys's at the moment it writes. Called in the
    test's body, not a fixture: pytest sets its own capture streams after fixtures are set up."""
    out, err = Writes(), Writes()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    return out, err


def test_info_is_one_flushed_line_on_the_stdout_of_the_moment(monkeypatch):
    out, err = replaced_streams(monkeypatch)
    log.info("all 2 hosts ready")
    log.info("100% of 50%s, %d and {braces} stay as written")
    assert out.calls == [
        "launcher: all 2 hosts ready\n",
        "<flush>",
        "launcher: 100% of 50%s, %d and {braces} stay as written\n",
        "<flush>",
    ]
    assert err.calls == []


def test_warnings_and_errors_go_to_stderr(monkeypatch):
    out, err = replaced_streams(monkeypatch)
    log.warning("cannot check the model folder /opt/ml/model: Permission denied")
    log.error("job FAILED (exit code 2): bad\nsecond line")
    assert err.getvalue() == (
        "launcher: cannot check the model folder /opt/ml/model: Permission denied\n"
        "launcher: job FAILED (exit code 2): bad\nsecond line\n"
    )
    assert out.calls == []


def test_a_root_handler_does_not_print_a_line_twice(monkeypatch):
    out, _ = replaced_streams(monkeypatch)
    root = logging.StreamHandler(out)
    logging.getLogger().addHandler(root)
    try:
        log.info("job completed")
    finally:
        logging.getLogger().removeHandler(root)
    assert out.getvalue() == "launcher: job completed\n"


def test_lines_keep_their_order_with_what_is_printed_between_them():
    """In a fresh interpreter, stdout a pipe (block-buffered), as under SageMaker: the logger's
    lines and plain writes to sys.stdout (mpirun's forwarded output) come out in order."""
    program = (
        "import sys\n"
        "from container.logs import log\n"
        "log.info('running: mpirun')\n"
        "sys.stdout.write('[1,0]<stdout>:rank line\\n')\n"
        "log.error('job FAILED (exit code 1): x')\n"
        "log.info('job completed')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout == (
        "launcher: running: mpirun\n[1,0]<stdout>:rank line\nlauncher: job completed\n"
    )
    assert result.stderr == "launcher: job FAILED (exit code 1): x\n"
