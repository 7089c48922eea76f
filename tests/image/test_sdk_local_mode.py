"""The SageMaker Python SDK 3 (`ModelTrainer`, sagemaker-train 1.27) and 2 (`Estimator`,
sagemaker 2.257) drive the image in their own local container mode, as a new user would: it writes the job's files and a compose file and
runs `docker compose up`, here podman-compose behind two small shims (`docker` -> podman,
`docker-compose` -> podman-compose). What the SDK puts into the containers is described in
docs/sdk3-modeltrainer.md; these tests prove what this image makes of each case:

- hyperparameters only, 1 and 2 hosts: the image's own `train` runs the built-in trainer (the
  SDK's `ethwe` interface resolved to the compose network's);
- SourceCode(entry_script) without and with distributed=MPI(): the SDK replaces the entry point
  with its sm_train.sh, whose driver the image hands to `train` (container/sdk_handover.py):
  one Horovod job over both containers, and a failing rank's host, line and exit code.

- the README's SDK 3 and SDK 2 blocks, as they stand: 2-container training, then a local
  endpoint answering from the trained model.

Each SDK runs in its own venv (scripts/setup_sdk.sh) and reaches no address but loopback
(tests/image/sdk_job.py). The compose network's name is fixed by the SDK (`sagemaker-local`),
so these jobs run one at a time, in this one file.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from container.network import free_port
from tests.image.conftest import REPO, run_script

pytestmark = pytest.mark.container

SDK3 = REPO / ".venv-sdk3" / "bin" / "python"
SDK2 = REPO / ".venv-sdk2" / "bin" / "python"

SCRIPT = """
import json, os, socket, sys
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
epochs = int(sys.argv[sys.argv.index("--epochs") + 1])  # the SDK's hyperparameters, as arguments
table = np.loadtxt(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "digits.csv"), delimiter=",")
table = table[hvd.rank():len(table) // 2 * 2:hvd.size()]
model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)),
              loss="sparse_categorical_crossentropy")
model.fit(table[:, 1:] / 16.0, table[:, 0], batch_size=32, epochs=epochs, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
if os.environ.get("FAIL_ON_HOST") == os.environ["SM_CURRENT_HOST"]:
    assert os.path.exists("weights.h5"), "no weights.h5 in " + os.getcwd()
report = {"rank": hvd.rank(), "size": hvd.size(), "host": os.environ["SM_CURRENT_HOST"],
          "hostname": socket.gethostname(), "cwd": os.getcwd(),
          "shipped": open("shipped.txt").read().strip(),
          "pid1": open("/proc/1/cmdline").read().replace("\\0", " ")}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank{hvd.rank()}.json"), "w") as out:
    json.dump(report, out)
"""


def containers(engine, root: Path) -> dict[str, str]:
    """Service (host) -> container id of the compose projects the SDK ran from folders under
    `root` (compose labels each container with its project's folder)."""
    return {
        service: container
        for folder, service, container in engine.labelled(
            "com.docker.compose.project",
            "com.docker.compose.project.working_dir",
            "com.docker.compose.service",
            check=False,
        )
        if Path(folder).is_relative_to(root)
    }


@pytest.fixture(scope="module")
def local_mode(engine, tmp_path_factory):
    """run(spec, name) -> (the output of the SDK's process, the local container root, each
    host's container exit code)."""
    for version in (2, 3):  # nothing when `make test`'s set-up made them
        subprocess.run(["bash", "scripts/setup_sdk.sh", str(version)], cwd=REPO, check=True)
    shims = tmp_path_factory.mktemp("docker-shims")
    compose = Path(sys.executable).with_name("podman-compose")
    # `docker context inspect` (Docker's own; podman answers `[]`, on which the SDK's endpoint
    # code fails) errs as with no remote context: the SDK then uses localhost
    (shims / "docker").write_text(
        '#!/bin/sh\n[ "$1" = context ] && { echo "no context" >&2; exit 1; }\nexec podman "$@"\n'
    )
    (shims / "docker-compose").write_text(f'#!/bin/sh\nexec {compose} --in-pod false "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    config = tmp_path_factory.mktemp("sdk-config") / "config.yaml"
    config.write_text(
        "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
        "      TelemetryOptOut: true\n"
    )
    env = {
        **engine.env,
        "PATH": f"{shims}:{engine.env['PATH']}",
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config),
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "AKIDLOCALTEST",
        "AWS_SECRET_ACCESS_KEY": "local-test-secret",
        "AWS_EC2_METADATA_DISABLED": "true",
    }

    def run(spec: dict, name: str, prepare=None, python: Path = SDK3):
        """`prepare(root)` lays out the working folder first."""
        root = tmp_path_factory.mktemp(f"sdk-{name}")
        refused = root / "refused-addresses"
        spec_file = root / "spec.json"
        spec_file.write_text(json.dumps({**spec, "root": str(root), "refused": str(refused)}))
        # ~/.sagemaker/config.yaml, the SDK's local-mode settings: a free port for endpoints,
        # and their compose folders under root, where containers() finds them
        (root / ".sagemaker").mkdir()
        (root / "serving").mkdir()
        (root / ".sagemaker" / "config.yaml").write_text(
            yaml.safe_dump(
                {"local": {"serving_port": free_port(), "container_root": str(root / "serving")}}
            )
        )
        if prepare:
            prepare(root)
        try:  # the SDK's process and its compose children, killed whole on a time-out
            result = run_script(
                [str(python), str(REPO / "tests/image/sdk_job.py"), str(spec_file)],
                {**env, "HOME": str(root)},
                timeout=600,
                cwd=root,
            )
            ids = containers(engine, root)
            codes = {
                host: int(
                    engine.run("inspect", "--format", "{{.State.ExitCode}}", container).stdout
                )
                for host, container in ids.items()
            }
        finally:  # the SDK leaves its stopped containers behind
            left = list(containers(engine, root).values())
            if left:
                engine.run("rm", "-f", *left, check=False)
        assert not refused.exists(), f"the SDK tried to reach {refused.read_text()}"
        output = result.stdout + result.stderr
        (root / "sdk-output.txt").write_text(output)  # all of it, for a failing test's reader
        return output, root, codes

    yield run
    engine.run("network", "rm", "sagemaker-local", check=False)


def test_hyperparameters_only_runs_the_builtin_trainer_on_one_host(local_mode, image, digits):
    output, root, codes = local_mode(
        {
            "image": image,
            "hosts": 1,
            "hyperparameters": {"epochs": 2},
            "channels": {name: str(digits / name) for name in ("train", "validation")},
        },
        "builtin",
    )
    assert codes == {"algo-1": 0}, output[-6000:]
    assert "world size 1" in output and "RESULT loss=" in output


def readme_blocks(sdk: int) -> list[str]:
    """The README's blocks for SDK 3 (ModelTrainer, then its LocalSession endpoint) or SDK 2
    (Estimator), as they stand."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    if sdk == 3:
        return [
            block for block in blocks if "ModelTrainer(" in block or "sagemaker.core.local" in block
        ]
    return [block for block in blocks if "Estimator(" in block]


def printed_answer(output: str, sdk: int) -> dict:
    """What the README's block printed: SDK 3 the response body (bytes), SDK 2 the
    deserialized dict."""
    if sdk == 3:
        found = re.search(r"^b'(\{.*\})'$", output, re.M)
        return json.loads(found.group(1)) if found else {}
    found = re.search(r"(\{'predictions'.*\})$", output, re.M)
    return ast.literal_eval(found.group(1)) if found else {}


@pytest.mark.parametrize("sdk", [3, pytest.param(2, marks=pytest.mark.slow)])
def test_the_readme_trains_on_two_containers_then_answers_from_an_endpoint(
    local_mode, image, digits, sdk
):
    """Hyperparameters only on 2 hosts (the image's own `train`; SDK 3's `ethwe` resolved),
    then the SDK's local endpoint runs the image's `serve` on the model.tar.gz local mode
    made, and gets a digit's class."""
    blocks = readme_blocks(sdk)
    assert len(blocks) == (2 if sdk == 3 else 1)
    snippet = "\n".join(blocks).replace('"sagemaker-horovod:cpu"', repr(image))

    def like_make_train(root):
        (root / "build" / "default-job" / "input").mkdir(parents=True)
        (root / "build" / "default-job" / "input" / "data").symlink_to(digits)

    output = local_mode(
        {"image": image, "snippet": snippet},
        f"readme-sdk{sdk}",
        like_make_train,
        SDK3 if sdk == 3 else SDK2,
    )[0]
    # (SDK 2 removes its training containers, so their logs, not their exit codes; it names
    # its compose services algo-1-<suffix>)
    for host in ("algo-1", "algo-2"):
        assert re.search(rf"\[{host}(-\w+)?\] \|.* launcher: job completed", output), output[-6000:]
    assert "world size 2" in output and "RESULT loss=" in output
    if sdk == 3:  # SDK 2's local mode writes no network_interface_name (eth0 is assumed)
        assert "network interface ethwe (resourceconfig.json) is not on this host" in output
    answer = printed_answer(output, sdk)
    assert answer, output[-6000:]
    prediction = answer["predictions"][0]
    assert 0 <= prediction["class"] <= 9 and len(prediction["probabilities"]) == 10


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user-src")
    (folder / "train.py").write_text(SCRIPT)
    (folder / "shipped.txt").write_text("from source_dir\n")
    return folder


# (distributed=, SourceCode's command, whether PID 1 of each container is our `train`)
WAYS = {
    "entry_script": (None, None, False),
    "entry_script+MPI": ({}, None, False),
    "command=exec train": (None, "exec train", True),
}


@pytest.mark.parametrize(
    "way",
    [way if way == "entry_script" else pytest.param(way, marks=pytest.mark.slow) for way in WAYS],
)
def test_source_code_runs_one_job_over_both_containers(local_mode, image, digits, source, way):
    mpi, command, train_is_pid1 = WAYS[way]
    output, root, codes = local_mode(
        {
            "image": image,
            "hosts": 2,
            "hyperparameters": {"epochs": 2},
            "source_code": {
                "source_dir": str(source),
                "command": command,
                "entry_script": "train.py",
            },
            "mpi": mpi,
            "channels": {"train": str(digits / "train")},
        },
        re.sub("[^a-z0-9]+", "-", way.lower()),
    )
    assert codes == {"algo-1": 0, "algo-2": 0}, output[-6000:]
    assert ("handed to this image's launcher: train" in output) == (command is None)
    model = root / "artifacts" / "model"  # where local mode gathers every host's model folder
    reports = sorted(
        (json.loads(path.read_text()) for path in model.glob("rank*.json")),
        key=lambda report: report["rank"],
    )
    assert [(r["rank"], r["size"], r["host"]) for r in reports] == [
        (0, 2, "algo-1"),
        (1, 2, "algo-2"),
    ], output[-6000:]
    assert {r["shipped"] for r in reports} == {"from source_dir"}
    assert {r["cwd"] for r in reports} == {"/opt/ml/code"}
    # only with our launcher as PID 1 does a stop (SIGTERM) reach it (otherwise PID 1 is the
    # SDK's `bash -c "... sm_train.sh"`): docs/sdk3-modeltrainer.md
    assert {r["pid1"].endswith("/bin/train ") for r in reports} == {train_is_pid1}, reports


@pytest.mark.slow
def test_a_failing_rank_is_the_jobs_failure(local_mode, image, digits, source):
    output, root, codes = local_mode(
        {
            "image": image,
            "hosts": 2,
            "hyperparameters": {"epochs": 1},
            "source_code": {"source_dir": str(source), "entry_script": "train.py"},
            "mpi": {"process_count_per_node": 1},
            "environment": {"FAIL_ON_HOST": "algo-2"},
            "channels": {"train": str(digits / "train")},
        },
        "failing",
    )
    # podman-compose exits 0 here even so, and then so does the SDK (it raises only when
    # compose fails), so the containers' own exit codes are what the job says
    assert codes == {"algo-1": 1, "algo-2": 1}, output[-6000:]
    # SageMaker shows one host's failure file; local mode copies each host's output folder
    # into artifacts/output, the last host's winning
    expected = (
        "rank 1 on host algo-2 failed (exit code 1): AssertionError: no weights.h5 in "
        "/opt/ml/code (at train.py, line"
    )
    assert (root / "artifacts" / "output" / "failure").read_text().startswith(expected)
    for host in ("algo-1", "algo-2"):
        assert any(
            f"[{host}]" in line and f"job FAILED (exit code 1): {expected}" in line
            for line in output.splitlines()
        ), output[-6000:]
