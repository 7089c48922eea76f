"""The GPU check as the lent GPU machine runs it, on this machine's CPU: a Python that has JAX
and Keras's own needs but nothing of this project's (no Keras, TensorFlow, MPI, toolkit or
boto3: .venv-gpu from `scripts/setup_sdk.sh gpu`), given only the carried wheels that
`scripts/gpu_check.sh prepare` made for it (.venv-gpu/wheels). Through the launcher the job
runs under PyPI's Open MPI 5, not the images' Open MPI 4."""

import os
import re
import socket
import subprocess

import pytest

from tests.conftest import ROOT

VENV = ROOT / ".venv-gpu"
WHEELS = VENV / "wheels"
SMALL = ["--samples", "2048", "--width", "8", "--epochs", "3"]


def started_check(*arguments: str, devices: int = 1) -> subprocess.Popen:
    """scripts/gpu_check.sh started with .venv-gpu's python3 first on PATH, as the lent
    machine's, and `devices` CPU devices in each JAX process (the lent machine's GPUs)."""
    env = {
        **os.environ,
        "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    }
    env.pop("PYTHONPATH", None)
    return subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *arguments],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(check: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = check.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        check.kill()
        raise
    return subprocess.CompletedProcess(check.args, check.returncode, stdout, stderr)


def gpu_check(
    *arguments: str, timeout: float = 300, devices: int = 1
) -> subprocess.CompletedProcess:
    """The check (started_check) run to its end."""
    return finished(started_check(*arguments, devices=devices), timeout)


@pytest.fixture(scope="module", autouse=True)
def machine_like_the_lent_one():
    assert (VENV / "bin" / "python3").exists() and WHEELS.is_dir(), (
        "run `bash scripts/setup_sdk.sh gpu` (make test's set-up does)"
    )
    bare = subprocess.run(
        [
            str(VENV / "bin" / "python3"),
            "-c",
            "import importlib.util as u; print([n for n in ('keras', 'mpi4py', "
            "'tensorflow', 'sagemaker_training', 'boto3') if u.find_spec(n)])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert bare.stdout.strip() == "[]", bare.stdout


def assert_throughputs(stdout: str, line_start: str) -> None:
    """The line starting `line_start` gives both runs' samples/s and their ratio, consistent."""
    summary = re.search(
        rf"^{re.escape(line_start)}launched ([\d,]+) samples/s, bare ([\d,]+) samples/s, "
        r"ratio ([\d.]+)",
        stdout,
        re.M,
    )
    assert summary, stdout
    launched, bare, ratio = (float(value.replace(",", "")) for value in summary.groups())
    assert launched > 0 and bare > 0 and ratio == pytest.approx(launched / bare, rel=0.01)


@pytest.mark.slow
def test_the_check_trains_through_the_launcher_and_bare_and_prints_the_ratio(tmp_path):
    done = gpu_check("run", str(WHEELS), "--workdir", str(tmp_path), *SMALL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_throughputs(done.stdout, "gpu check: ")
    assert "gpu check: cpu x1, global batch 512, 2048 samples x 3 epochs" in done.stdout
    assert (
        "gpu check: model parallel: skipped: the machine has 1 cpu device and a model axis "
        "needs 2 or more"
    ) in done.stdout, done.stdout
    assert not (tmp_path / "launched-model-parallel.log").exists()
    through = (tmp_path / "launched.log").read_text()
    # the launcher's mpirun is Open MPI 5's (the carried wheel), its rank tagged in the output
    assert "launcher: running: mpirun --allow-run-as-root" in through, through[-3000:]
    assert re.search(r"^\[1,0\]<stdout>: ?PROCESSES 1$", through, re.M), through[-3000:]
    assert "launcher: job completed" in through
    assert (tmp_path / "ml" / "model" / "model.keras").is_file()
    assert not (tmp_path / "ml" / "output" / "failure").exists()
    alone = (tmp_path / "bare.log").read_text()
    assert "could not initialize the distribution" in alone  # the guide's try/except, bare
    assert "PROCESSES 1" in alone and "launcher" not in alone
    assert (tmp_path / "bare-model" / "model.keras").is_file()


def kilobytes(text: str) -> float:
    """train.layouts.megabytes' '9.0 kB' or '1.2 MB' in kB."""
    number, unit = text.split()
    return float(number) * {"kB": 1, "MB": 1000}[unit]


@pytest.mark.slow
def test_the_check_also_splits_the_model_over_all_devices_through_the_launcher_and_bare(
    tmp_path,
):
    done = gpu_check("run", str(WHEELS), "--workdir", str(tmp_path), *SMALL, devices=2)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu check: cpu x2, global batch 512, 2048 samples x 3 epochs" in done.stdout
    assert_throughputs(done.stdout, "gpu check: ")
    assert (
        "gpu check: model parallel: the same job, its model split over all 2 cpu devices "
        "(a model axis of 2, one data-parallel replica)"
    ) in done.stdout, done.stdout
    assert_throughputs(done.stdout, "gpu check: model parallel: ")
    weighs = re.search(
        r"^gpu check: model parallel: ([\d.]+K) parameters, ([\d.]+ [kM]B); ([\d.]+ [kM]B) per "
        r"device over a model axis of 2 \(data parallel: ([\d.]+ [kM]B) per device\)$",
        done.stdout,
        re.M,
    )
    assert weighs, done.stdout
    whole, per_device, data_parallel = (kilobytes(text) for text in weighs.groups()[1:])
    # every kernel is split in two; the biases (a few dozen floats) stay whole on each device
    assert whole == data_parallel and whole / 2 <= per_device < 0.6 * whole, weighs.group(0)
    through = (tmp_path / "launched-model-parallel.log").read_text()
    assert re.search(r"^\[1,0\]<stdout>: ?PROCESSES 1$", through, re.M), through[-3000:]
    assert re.search(r"<stdout>: ?DEVICES cpu 2$", through, re.M), through[-3000:]
    assert "launcher: job completed" in through
    assert "matched no variable" not in through and "sharded none" not in through
    assert (tmp_path / "ml-model-parallel" / "model" / "model.keras").is_file()
    alone = (tmp_path / "bare-model-parallel.log").read_text()
    assert "DEVICES cpu 2" in alone and "launcher" not in alone
    assert (tmp_path / "bare-model-parallel-model" / "model.keras").is_file()


def test_a_machine_without_the_carried_wheels_is_told_what_it_lacks():
    env = {**os.environ, "PATH": str(VENV / "bin")}  # no mpirun either
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(VENV / "bin" / "python3"), str(ROOT / "scripts" / "gpu_check.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lacks = done.stdout
    for name in ("keras", "mpi4py", "sagemaker_training", "boto3", "mpirun"):
        assert name in lacks, lacks
    assert "jax (" not in lacks and "Traceback" not in done.stderr


def test_a_wrong_mode_is_refused_with_the_usage():
    done = gpu_check("check")
    assert done.returncode == 2 and "usage: scripts/gpu_check.sh prepare" in done.stderr


def test_a_run_past_its_time_is_stopped_with_everything_it_started(tmp_path):
    done = gpu_check("run", str(WHEELS), "--workdir", str(tmp_path), *SMALL, "--timeout", "6")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu check: FAILED: launched exited 124" in done.stdout, done.stdout[-3000:]
    assert "launched ran past 6 s and was stopped" in done.stdout
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout == "", left.stdout  # no launcher, mpirun or rank of this run is left


@pytest.mark.slow
def test_two_checks_at_once_beside_a_server_on_port_7777_each_meet_on_a_port_of_their_own(
    tmp_path,
):
    """Two checks at once (pytest -n 2 ran the two above together) collided on JAX's
    coordinator port 7777: one job's process registered with the other's coordinator, which
    aborted. Something else on 7777 (here a plain server) made the launched job's JAX fail to
    start, which the check did not notice (the script goes on alone, as bare). Each launched
    job now takes a free port of its own (container.ports)."""
    try:
        server = socket.create_server(("", 7777), family=socket.AF_INET6, dualstack_ipv6=True)
    except OSError:  # something already holds it: the case this test makes
        server = None
    try:
        checks = [
            started_check("run", str(WHEELS), "--workdir", str(tmp_path / name), *SMALL)
            for name in ("one", "two")
        ]
        done = [finished(check, timeout=480) for check in checks]
    finally:
        if server is not None:
            server.close()
    coordinators = []
    for name, check in zip(("one", "two"), done):
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
        through = (tmp_path / name / "launched.log").read_text()
        assert "could not initialize the distribution" not in through, through[-3000:]
        assert "launcher: job completed" in through
        found = re.search(r'"coordinator":"localhost:(\d+)"', through)
        assert found, through[-3000:]
        coordinators.append(int(found.group(1)))
    assert 7777 not in coordinators and len(set(coordinators)) == 2, coordinators
