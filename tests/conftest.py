"""Shared fixtures: SageMaker job trees and the real `train` command."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from job.paths import MlPaths
from job.sagemaker_config import JobConfig, ResourceConfig, write_job_config
from scripts.default_job import digits_channels
from scripts.digits_files import write_digits
from tests import file_order, fuzzing

ROOT = Path(__file__).resolve().parent.parent
TRAIN = Path(sys.executable).with_name("train")


def pytest_collection_modifyitems(items):
    """The files with the longest last runs first (tests/file_order.py says why and how)."""
    file_order.longest_first(items)


FILE_TIMER = file_order.Timer()


def pytest_deselected(items):
    """A file run in part by -k would record less than its whole time. (-m is how `make test`
    splits its sessions: a file's tests of each kind always run in the same one.)"""
    if items and items[0].config.option.keyword:
        FILE_TIMER.partial.update(file_order.file_of(item.nodeid, item.keywords) for item in items)


def pytest_sessionfinish(session):
    """Record each file's seconds for the next run's order: once, on the controller (an xdist
    worker has `workerinput`), and only for a run that was not cut short by an error."""
    if (
        not hasattr(session.config, "workerinput")
        and not session.shouldfail
        and not session.shouldstop
    ):
        FILE_TIMER.save()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A fuzz test's inputs (tests.fuzzing) go into its report, which xdist carries home."""
    outcome = yield
    if call.when == "call":
        outcome.get_result().user_properties.extend(fuzzing.take_counts())


FUZZ_TALLY = fuzzing.Tally()


def pytest_runtest_logreport(report):
    FUZZ_TALLY.add(report)
    FILE_TIMER.add(report)


def pytest_terminal_summary(terminalreporter):
    """`fuzz: PARSER: N inputs tried, F failures` for each parser fuzzed in this session."""
    for line in FUZZ_TALLY.lines():
        terminalreporter.write_line(line)


@pytest.fixture
def make_job(tmp_path):
    """make_job(hyperparameters, hosts=['algo-1'], current='algo-1', name=..., data='csv')
    -> ml root of the digits job on loopback (the digits as `data` files: csv, tfrecord or
    images), as SageMaker would lay it out on host `current`."""

    def make(
        hyperparameters: dict, hosts=("algo-1",), current="algo-1", name=None, data="csv"
    ) -> Path:
        paths = MlPaths(tmp_path / (name or current))
        write_job_config(
            JobConfig(
                paths,
                ResourceConfig(current, tuple(hosts), "lo"),
                hyperparameters,
                digits_channels(data),
            )
        )
        write_digits(paths.data_dir, data)
        return paths.root

    return make


@pytest.fixture
def make_script_job(make_job):
    """make_script_job(program, hyperparameters, source, ...) -> ml root with code/<program>."""

    def make(program: str, hyperparameters: dict, source: str, **job) -> Path:
        root = make_job({**hyperparameters, "sagemaker_program": program}, **job)
        (root / "code").mkdir(exist_ok=True)
        (root / "code" / program).write_text(source)
        return root

    return make


def run_train(root: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(TRAIN), "--ml-root", str(root), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_until(root: Path, after: str) -> tuple[subprocess.Popen, list[str]]:
    """Start the launcher on the job under `root` and read its output up to the first line
    holding `after`; the running job and the lines read."""
    job = subprocess.Popen(
        [str(TRAIN), "--ml-root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in job.stdout:
        seen.append(line)
        if after in line:
            break
    return job, seen


def stop_job(root: Path, after: str, delay: float = 0.0) -> str:
    """Run the job, SIGTERM its launcher `delay` s after its first line holding `after` (a spot
    stop at a chosen moment); its output. The stop is reported as one: exit 143 and a failure
    file that says so."""
    job, seen = start_until(root, after)
    time.sleep(delay)
    job.send_signal(signal.SIGTERM)
    output = "".join(seen) + job.communicate(timeout=120)[0]
    assert job.returncode == 143, output[-3000:]
    assert failure_of(root).startswith("training was stopped by a signal"), failure_of(root)
    return output


def checkpoint_order(folder: Path) -> tuple[str, int]:
    """Sorts checkpoint folders `epoch-NNNNNN[.K]` oldest first (`.9` before `.10`)."""
    return folder.stem, int(folder.suffix[1:] or 0)


def newest_state(root: Path) -> dict:
    """The state.json of the newest checkpoint of the job under `root`."""
    newest = max((root / "checkpoints").glob("epoch-*"), key=checkpoint_order)
    return json.loads((newest / "state.json").read_text())


def kill_host(launcher: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process below it, as a lost host (a reclaimed spot
    instance) takes them all at once. Its process group is not enough: mpirun and a data
    host's script run in sessions of their own (container.session)."""
    import psutil

    root = psutil.Process(launcher.pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    launcher.wait()


def failure_of(root: Path) -> str:
    path = root / "output" / "failure"
    return path.read_text() if path.exists() else ""


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
