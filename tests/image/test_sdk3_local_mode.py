"""The SageMaker Python SDK 3 (`ModelTrainer`, sagemaker-train 1.27) drives the image in its own
local container mode, as a new user would: it writes the job's files and a compose file and
runs `docker compose up`, here podman-compose behind two small shims (`docker` -> podman,
`docker-compose` -> podman-compose). What the SDK puts into the containers is described in
docs/sdk3-modeltrainer.md; these tests prove what this image makes of each case:

- hyperparameters only, 1 and 2 hosts: the image's own `train` runs the built-in trainer (the
  SDK's `ethwe` interface resolved to the compose network's);
- SourceCode(entry_script) without and with distributed=MPI(): the SDK replaces the entry point
  with its sm_train.sh, whose driver the image hands to `train` (container/sdk_handover.py):
  one Horovod job over both containers, and a failing rank's host, line and exit code.

The SDK runs in its own venv (scripts/setup_sdk3.sh) and reaches no address but loopback
(tests/image/sdk3_job.py). The compose network's name is fixed by the SDK (`sagemaker-local`),
so these jobs run one at a time, in this one file.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from container.network import free_port
from tests.image.conftest import REPO, run_script

pytestmark = pytest.mark.container

SDK_PYTHON = REPO / ".venv-sdk3" / "bin" / "python"

SCRIPT = '''
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
'''


def containers(engine, root: Path) -> dict[str, str]:
    """Service (host) -> container id of the compose projects the SDK ran from folders under
    `root` (compose labels each container with its project's folder)."""
    ids = engine.run("ps", "-a", "-q", "--filter", "label=com.docker.compose.project",
                     check=False).stdout.split()
    lines = engine.run("inspect", "--format", "{{index .Config.Labels "
                       '"com.docker.compose.project.working_dir"}} {{index .Config.Labels '
                       '"com.docker.compose.service"}} {{.Id}}', *ids,
                       check=False).stdout if ids else ""
    return {service: container for folder, service, container in
            (line.split() for line in lines.splitlines() if line.strip())
            if Path(folder).is_relative_to(root)}


@pytest.fixture(scope="module")
def sdk3(engine, tmp_path_factory):
    """run(spec, name) -> (the output of the SDK's process, the local container root, each
    host's container exit code)."""
    if not SDK_PYTHON.exists():
        subprocess.run(["bash", "scripts/setup_sdk3.sh"], cwd=REPO, check=True)
    shims = tmp_path_factory.mktemp("docker-shims")
    compose = Path(sys.executable).with_name("podman-compose")
    # `docker context inspect` (Docker's own; podman answers `[]`, on which the SDK's endpoint
    # code fails) errs as with no remote context: the SDK then uses localhost
    (shims / "docker").write_text('#!/bin/sh\n[ "$1" = context ] && { echo "no context" >&2; '
                                  'exit 1; }\nexec podman "$@"\n')
    (shims / "docker-compose").write_text(f'#!/bin/sh\nexec {compose} --in-pod false "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    config = tmp_path_factory.mktemp("sdk3-config") / "config.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                      "      TelemetryOptOut: true\n")
    env = {**engine.env, "PATH": f"{shims}:{engine.env['PATH']}",
           "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config), "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "AKIDLOCALTEST",
           "AWS_SECRET_ACCESS_KEY": "local-test-secret", "AWS_EC2_METADATA_DISABLED": "true"}

    def run(spec: dict, name: str):
        root = tmp_path_factory.mktemp(f"sdk3-{name}")
        refused = root / "refused-addresses"
        spec_file = root / "spec.json"
        spec_file.write_text(json.dumps({**spec, "root": str(root), "refused": str(refused)}))
        try:  # the SDK's process and its compose children, killed whole on a time-out
            result = run_script([str(SDK_PYTHON), str(REPO / "tests/image/sdk3_job.py"),
                                 str(spec_file)], env, timeout=600)
            ids = containers(engine, root)
            codes = {host: int(engine.run("inspect", "--format", "{{.State.ExitCode}}",
                                          container).stdout) for host, container in ids.items()}
        finally:  # the SDK leaves its stopped containers behind
            left = list(containers(engine, root).values())
            if left:
                engine.run("rm", "-f", *left, check=False)
        assert not refused.exists(), f"the SDK tried to reach {refused.read_text()}"
        return result.stdout + result.stderr, root, codes

    yield run
    engine.run("network", "rm", "sagemaker-local", check=False)


def builtin_job(sdk3, image, digits, hosts):
    output, root, codes = sdk3({"image": image, "hosts": hosts,
                               "hyperparameters": {"epochs": 2, "learning_rate": 0.002},
                               "channels": {name: str(digits / name)
                                            for name in ("train", "validation")}},
                              f"builtin-{hosts}")
    assert codes == {f"algo-{n}": 0 for n in range(1, hosts + 1)}, output[-6000:]
    assert f"world size {hosts}" in output and "RESULT loss=" in output
    return output, root


@pytest.fixture(scope="module")
def two_host_builtin_job(sdk3, image, digits):
    return builtin_job(sdk3, image, digits, 2)


def test_hyperparameters_only_runs_the_builtin_trainer_on_one_host(sdk3, image, digits):
    builtin_job(sdk3, image, digits, 1)


def test_hyperparameters_only_runs_the_builtin_trainer_on_two_hosts(two_host_builtin_job):
    output, root = two_host_builtin_job
    assert "network interface ethwe (resourceconfig.json) is not on this host" in output
    assert (root / "compressed_artifacts" / "model.tar.gz").is_file()


def test_the_trained_model_answers_through_a_local_endpoint(sdk3, image, two_host_builtin_job):
    """LocalSession's create_model / create_endpoint run the image's `serve` on the model.tar.gz
    local mode made; invoke_endpoint gets the class of a digit."""
    _, root = two_host_builtin_job
    row = ",".join(["0"] * 64)
    output, _, _ = sdk3({"image": image, "deploy": {
        "model_data": f"file://{root / 'compressed_artifacts' / 'model.tar.gz'}",
        "port": free_port(), "content_type": "text/csv", "body": row}}, "serve")
    answer = [line for line in output.splitlines() if line.startswith("RESPONSE ")]
    assert answer, output[-6000:]
    content_type, body = answer[0].split(" ", 2)[1:]
    assert content_type.startswith("application/json")
    prediction = json.loads(body)["predictions"][0]
    assert 0 <= prediction["class"] <= 9 and len(prediction["probabilities"]) == 10


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user-src")
    (folder / "train.py").write_text(SCRIPT)
    (folder / "shipped.txt").write_text("from source_dir\n")
    return folder


# (distributed=, SourceCode's command, whether PID 1 of each container is our `train`)
WAYS = {"entry_script": (None, None, False),
        "entry_script+MPI": ({}, None, False),
        "command=exec train": (None, "exec train", True)}


@pytest.mark.parametrize("way", WAYS)
def test_source_code_runs_one_job_over_both_containers(sdk3, image, digits, source, way):
    mpi, command, train_is_pid1 = WAYS[way]
    output, root, codes = sdk3({"image": image, "hosts": 2, "hyperparameters": {"epochs": 2},
                               "source_code": {"source_dir": str(source), "command": command,
                                               "entry_script": "train.py"},
                               "mpi": mpi, "channels": {"train": str(digits / "train")}},
                              re.sub("[^a-z0-9]+", "-", way.lower()))
    assert codes == {"algo-1": 0, "algo-2": 0}, output[-6000:]
    assert ("handed to this image's launcher: train" in output) == (command is None)
    model = root / "artifacts" / "model"  # where local mode gathers every host's model folder
    reports = sorted((json.loads(path.read_text()) for path in model.glob("rank*.json")),
                     key=lambda report: report["rank"])
    assert [(r["rank"], r["size"], r["host"]) for r in reports] == \
        [(0, 2, "algo-1"), (1, 2, "algo-2")], output[-6000:]
    assert {r["shipped"] for r in reports} == {"from source_dir"}
    assert {r["cwd"] for r in reports} == {"/opt/ml/code"}
    # only with our launcher as PID 1 does a stop (SIGTERM) reach it (otherwise PID 1 is the
    # SDK's `bash -c "... sm_train.sh"`): docs/sdk3-modeltrainer.md
    assert {r["pid1"].endswith("/bin/train ") for r in reports} == {train_is_pid1}, reports


def test_a_failing_rank_is_the_jobs_failure(sdk3, image, digits, source):
    output, root, codes = sdk3({"image": image, "hosts": 2, "hyperparameters": {"epochs": 1},
                               "source_code": {"source_dir": str(source),
                                               "entry_script": "train.py"},
                               "mpi": {"process_count_per_node": 1},
                               "environment": {"FAIL_ON_HOST": "algo-2"},
                               "channels": {"train": str(digits / "train")}}, "failing")
    # podman-compose exits 0 here even so, and then so does the SDK (it raises only when
    # compose fails), so the containers' own exit codes are what the job says
    assert codes == {"algo-1": 1, "algo-2": 1}, output[-6000:]
    # SageMaker shows one host's failure file; local mode copies each host's output folder
    # into artifacts/output, the last host's winning
    expected = "rank 1 on host algo-2 failed (exit code 1): AssertionError: no weights.h5 in " \
               "/opt/ml/code (at train.py, line"
    assert (root / "artifacts" / "output" / "failure").read_text().startswith(expected)
    for host in ("algo-1", "algo-2"):
        assert any(f"[{host}]" in line and f"job FAILED (exit code 1): {expected}" in line
                   for line in output.splitlines()), output[-6000:]
