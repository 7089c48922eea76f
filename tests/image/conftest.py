"""Fixtures for the container tests: the CPU image, the digits data, clusters that clean up.

Everything here is real: the image is built with podman (or Docker when a daemon answers) from
the local Debian base, clusters run with podman-compose, the registry is Debian's
docker-registry on loopback. Every container, network and registry these tests start carries
the prefix below and is removed when its test ends, pass or fail; a last sweep at the end of
the session removes anything a crashed test left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from container.network import free_port
from scripts import local_cluster
from tests.conftest import checkpoint_order

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("TEST_IMAGE", local_cluster.DEFAULT_IMAGE)
# Compose projects and containers made by these tests; TEST_PREFIX keeps two concurrent test
# sessions on one machine from sweeping each other's containers.
# Under pytest-xdist each worker has its own prefix, so that one's sweep never removes what the
# other is running.
PREFIX = "-".join(
    filter(None, (os.environ.get("TEST_PREFIX", "smtest"), os.environ.get("PYTEST_XDIST_WORKER")))
)


def unique(name: str) -> str:
    return f"{PREFIX}-{name}-{uuid.uuid4().hex[:6]}"


# The first test that needs the image builds it: from scratch that is the base image plus a
# TensorFlow install and a Horovod compile (about 15 minutes on 2 busy cores), longer than
# the suite's default per-test timeout (pyproject.toml).
BUILD_TIMEOUT_S = 2700


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S))


def run_script(
    argv: list[str], env: dict, timeout: float, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """Run a script in its own process group, and kill the whole group (an engine build or
    push included) if the test is interrupted or times out."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def run_offline(
    engine: local_cluster.Engine, image: str, *command: str, options=(), timeout: float = 300
) -> subprocess.CompletedProcess:
    """`run --rm --network none [options] image command...`: a one-off container that reaches
    nothing (a download fails loudly); its result whatever its exit code, for the test to
    judge."""
    return engine.run(
        "run", "--rm", "--network", "none", *options, image, *command, check=False, timeout=timeout
    )


@pytest.fixture(scope="session")
def engine() -> local_cluster.Engine:
    return local_cluster.Engine.detect()


@pytest.fixture(scope="session", autouse=True)
def sweep_leftovers(engine):
    """After the session: nothing of ours may remain (a crashed fixture's leftovers)."""
    yield
    # Names compared here, not with `--filter name=`: the engine's filter matches anywhere in a
    # name, so another session's sweep for `b-` would also remove `c-keras-hub-..._algo-1_1`.
    listed = engine.run("ps", "-a", "--format", "{{.ID}} {{.Names}}", check=False).stdout
    ids = [
        fields[0]
        for fields in map(str.split, listed.splitlines())
        if len(fields) > 1 and fields[1].startswith(f"{PREFIX}-")
    ]
    if ids:
        engine.run("rm", "-f", *ids, check=False)
    networks = engine.run("network", "ls", "--format", "{{.Name}}", check=False).stdout.split()
    ours = [n for n in networks if n.startswith(PREFIX)]
    if ours:
        engine.run("network", "rm", *ours, check=False)


@pytest.fixture(scope="session")
def image(engine) -> str:
    """The CPU image, built from the local Debian base (cached layers after the first time).
    `make test` builds it in a phase of its own before these tests and says so with
    TEST_IMAGE_BUILT=1: then it is only checked, so that parallel test workers never build
    into one build context at once."""
    if os.environ.get("TEST_IMAGE_BUILT") == "1":
        if engine.run("image", "inspect", IMAGE, check=False).returncode:
            pytest.fail(f"TEST_IMAGE_BUILT=1 but there is no image {IMAGE}")
        return IMAGE
    result = run_script(
        ["bash", "scripts/build_image.sh"],
        {**engine.env, "VARIANT": "cpu", "IMAGE": IMAGE},
        BUILD_TIMEOUT_S - 60,
    )
    if result.returncode:
        pytest.fail(f"image build failed (exit {result.returncode}):\n{result.stderr[-6000:]}")
    return IMAGE


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> Path:
    """The embedded digits dataset: a folder with channels train/ and validation/ (CSV)."""
    root = tmp_path_factory.mktemp("digits-job")
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "default_job.py"),
            "--ml-root",
            str(root),
            "--no-run",
        ],
        check=True,
        capture_output=True,
    )
    return root / "input" / "data"


@contextlib.contextmanager
def compose_cluster(engine, spec, name: str, edit=None) -> Iterator[local_cluster.ComposeCluster]:
    """Write the cluster (optionally editing the compose document), yield it, always `down`."""
    path = local_cluster.write_cluster(spec)
    if edit is not None:
        document = yaml.safe_load(path.read_text())
        edit(document)
        path.write_text(yaml.safe_dump(document, sort_keys=False))
    cluster = local_cluster.ComposeCluster(engine, path, unique(name))
    try:
        yield cluster
    finally:
        cluster.down()
        left = engine.run(
            "ps",
            "-a",
            "-q",
            "--filter",
            f"label=com.docker.compose.project={cluster.project}",
            check=False,
        ).stdout.split()
        if left:
            engine.run("rm", "-f", *left, check=False)


def http(method: str, url: str, body: bytes | None = None, headers=None, timeout=10.0):
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@contextlib.contextmanager
def serving(engine, image: str, model: Path) -> Iterator[str]:
    """`serve` from the image on `model`, healthy; yields its URL, always removed."""
    port, name = free_port(), unique("serve")
    engine.run(
        "run",
        "-d",
        "--name",
        name,
        "-p",
        f"127.0.0.1:{port}:8080",
        "-v",
        f"{model}:/opt/ml/model:ro",
        image,
        "serve",
    )
    try:
        deadline = time.monotonic() + 240  # SageMaker's limit for passing pings
        status = None
        while status != 200:
            assert time.monotonic() < deadline, engine.run("logs", name, check=False).stderr
            try:
                status, _ = http("GET", f"http://127.0.0.1:{port}/ping", timeout=2)
            except OSError:
                status = None
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        engine.run("rm", "-f", name, check=False)


def assert_serves_the_digits(engine, image: str, model: Path, data: Path) -> None:
    """`serve` from `image` answers 50 validation digits with their classes, 40 right or more."""
    import numpy as np

    rows = np.loadtxt(data / "validation" / "digits.csv", delimiter=",")[:50]
    with serving(engine, image, model) as url:
        status, answer = http(
            "POST",
            f"{url}/invocations",
            json.dumps({"instances": rows[:, 1:].tolist()}).encode(),
            {"Content-Type": "application/json"},
            timeout=60,
        )
    assert status == 200, answer
    predictions = json.loads(answer)["predictions"]
    correct = sum(str(p["class"]) == str(int(label)) for p, label in zip(predictions, rows[:, 0]))
    assert correct >= 40, predictions[:3]


def wait_for_log(cluster, host: str, text: str, timeout: float) -> None:
    """Poll `host`'s log until it holds `text`; AssertionError if it exits or the time is up."""
    deadline = time.monotonic() + timeout
    while text not in cluster.logs(host):
        if time.monotonic() > deadline:
            raise AssertionError(f"{host} never logged {text!r}:\n{cluster.logs(host)[-3000:]}")
        if not cluster.state(host).get("Running"):
            raise AssertionError(
                f"{host} exited before logging {text!r}:\n{cluster.logs(host)[-3000:]}"
            )
        time.sleep(1)


def kill_a_worker_rank_in_epoch_2(engine, spec, name: str) -> tuple[dict[str, int], str]:
    """Run the 2-host job `spec` (with max_restarts) and SIGKILL the rank on algo-2 (the
    out-of-memory killer's signature) once epoch 1 is reported; every host's exit code and
    the leader's log."""
    with compose_cluster(engine, spec, name) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        wait_for_log(cluster, "algo-1", "METRICS epoch=1 ", timeout=300)
        engine.run(
            "exec", cluster.containers()["algo-2"], "pkill", "-KILL", "-f", "train.rank_main"
        )
        return cluster.wait_all_exited(600), cluster.logs("algo-1")


def failure(spec, host: str) -> str:
    path = local_cluster.host_paths(spec, host).failure_file
    return path.read_text() if path.exists() else ""


def logs(cluster) -> str:
    return "\n".join(f"--- {host}\n{cluster.logs(host)[-3000:]}" for host in cluster.containers())


def tear_newest_checkpoint(spec, epochs: int) -> tuple[Path, Path]:
    """The leader's newest checkpoint with a torn variables file (as a partial S3 sync leaves
    it), and every host's job set to run `epochs` epochs when it starts again; the checkpoint
    before it (where the job must resume) and the torn one."""
    before, newest = leader_checkpoints(spec)[-2:]
    variables = next(newest.glob("ckpt.[dn]*"))  # TensorFlow's ckpt.data-*, Keras 3's ckpt.npz
    variables.write_bytes(variables.read_bytes()[:64])
    set_epochs(spec, epochs)
    return before, newest


def set_epochs(spec, epochs: int) -> None:
    """Every host's job set to run `epochs` epochs in all when it starts again (a restarted
    job asked for more or fewer epochs than it first was)."""
    for host in spec.host_names:
        config = local_cluster.host_paths(spec, host).hyperparameters
        config.write_text(json.dumps({**json.loads(config.read_text()), "epochs": str(epochs)}))


def restart(cluster, spec) -> None:
    """The same job again on the same hosts' folders (checkpoints kept, failure files
    cleared), as a restarted SageMaker job with the same checkpoint S3 location."""
    cluster.down()
    for host in spec.host_names:
        local_cluster.host_paths(spec, host).failure_file.unlink(missing_ok=True)
    cluster.compose("up", "-d", capture=True, timeout=300)


def leader_checkpoints(spec) -> list[Path]:
    """The leader's checkpoint folders, oldest first."""
    return sorted(
        local_cluster.host_paths(spec, "algo-1").checkpoint_dir.glob("epoch-*"),
        key=checkpoint_order,
    )


def newest_checkpoint(spec) -> tuple[Path, dict]:
    """The leader's newest checkpoint folder and its state.json."""
    newest = leader_checkpoints(spec)[-1]
    return newest, json.loads((newest / "state.json").read_text())


def code_folder(tmp_path: Path, script: Path) -> Path:
    """A code folder holding `script` alone, for add_code."""
    folder = tmp_path / "code"
    folder.mkdir()
    shutil.copy(script, folder / script.name)
    return folder


def add_code(folder: Path):
    def edit(document):
        for service in document["services"].values():
            service["volumes"].append(f"{folder}:/opt/ml/code:ro")

    return edit


@pytest.fixture(scope="session")
def data(digits, tmp_path_factory) -> Path:
    """The digits in two train files (one per host when sharded) and a validation channel."""
    root = tmp_path_factory.mktemp("matrix-data")
    rows = np.loadtxt(digits / "train" / "digits.csv", delimiter=",")
    (root / "train").mkdir()
    (root / "validation").mkdir()
    for part, half in enumerate(np.array_split(rows, 2)):
        np.savetxt(root / "train" / f"part-{part}.csv", half, delimiter=",", fmt="%g")
    np.savetxt(root / "validation" / "digits.csv", rows[:200], delimiter=",", fmt="%g")
    return root
