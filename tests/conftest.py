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
from tests import fuzzing

ROOT = Path(__file__).resolve().parent.parent
TRAIN = Path(sys.executable).with_name("train")

# The files whose jobs take minutes, longest first (seconds on one of two busy workers, measured
# with --durations on 2026-12-06). `make test` hands whole files to two pytest-xdist workers as
# they come free, in collection order (--no-loadscope-reorder; xdist's own order puts the files
# with the most tests first, which left these few-test, long files for the end and one worker
# idle beside the last of them).
LONG_FILES = (
    "tests/container/test_watchdog.py",  # 280
    "tests/bench/test_bench_runs.py",  # 250
    "tests/image/test_keras_jax.py",  # 235
    "tests/image/test_fault_matrix.py",  # 175
    "tests/image/test_tf_trainer.py",  # 175
    "tests/image/test_sdk_local_mode.py",  # 160
    "tests/image/test_keras_trainer.py",  # 135
    "tests/train/test_exact_resume.py",  # 90
    "tests/image/test_tf_stack.py",  # 80
    "tests/train/test_distributed_training.py",  # 80
    "tests/container/test_restarts.py",  # 65
    "tests/image/test_local_cluster.py",  # 65
    "tests/train/test_data_jobs.py",  # 65
    "tests/container/test_gpu_check.py",  # 60
    "tests/container/test_instance_groups.py",  # 55
    "tests/container/test_mlflow.py",  # 50 (the server's start: 10-50)
    "tests/image/test_hetero_cluster.py",  # 45
    "tests/serve/test_serve_survival.py",  # 15-65
)


def pytest_collection_modifyitems(items):
    """The long files first, in LONG_FILES' order; the rest as collected."""
    rank = {name: index for index, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A fuzz test's inputs (tests.fuzzing) go into its report, which xdist carries home."""
    outcome = yield
    if call.when == "call":
        outcome.get_result().user_properties.extend(fuzzing.take_counts())


FUZZ_TALLY = fuzzing.Tally()


def pytest_runtest_logreport(report):
    FUZZ_TALLY.add(report)


def pytest_terminal_summary(terminalreporter):
    """`fuzz: PARSER: N inputs tried, F failures` for each parser fuzzed in this session."""
    for line in FUZZ_TALLY.lines():
        terminalreporter.write_line(line)


@pytest.fixture
def make_job(tmp_path):
    """make_job(hyperparameters, hosts=['algo-1'], current='algo-1', name=..., data='csv')
    -> ml root of the digits job on loopback (the digits as `data` files: csv, tfrecord or
    images), as SageMaker would lay it out on host `current`."""

    def make(hyperparameters: dict, hosts=("algo-1",), current="algo-1", name=None,
             data="csv") -> Path:
        paths = MlPaths(tmp_path / (name or current))
        write_job_config(JobConfig(paths, ResourceConfig(current, tuple(hosts), "lo"),
                                   hyperparameters, digits_channels(data)))
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
    return subprocess.run([str(TRAIN), "--ml-root", str(root), *extra], capture_output=True,
                          text=True, timeout=timeout)


def start_until(root: Path, after: str) -> tuple[subprocess.Popen, list[str]]:
    """Start the launcher on the job under `root` and read its output up to the first line
    holding `after`; the running job and the lines read."""
    job = subprocess.Popen([str(TRAIN), "--ml-root", str(root)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
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
