"""The SageMaker SDK's own flow, without AWS: `Estimator(entry_point="train.py",
source_dir="src/")` packs src/ (a script and a requirements.txt naming a package that ships
as a wheel inside it) as sourcedir.tar.gz and uploads it to S3, here a real S3 API server on
loopback (moto_server). A 2-host job (127.0.0.1 and 127.0.0.2, as in test_multi_host) fetches
it on each host, installs the package, trains with the script and saves with a plain
model.save. Then the real `serve` answers CSV and JSON, and batch transform's MultiRecord
requests assemble into exactly one line per record; a Keras-free process loading the same
SavedModel gives the server's numbers (with Horovod imported: a plain model.save keeps the
optimizer and its Horovod ops; distributed.export leaves them out)."""

import json
import os
import subprocess
import sysconfig
import tarfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from serve.model import horovod_op_library
from tests.conftest import TRAIN
from tests.helpers import loopback_hyperparameters
from tests.portable import call_savedmodel
from tests.s3_server import s3_server, uninstall, write_wheel  # noqa: F401
from tests.serve.serve_testing import Server

HOSTS = ["127.0.0.1", "127.0.0.2"]

SCRIPT = """
import os
import numpy as np
import tensorflow as tf
import {package} as settings
from train import distributed

distributed.init()
table = np.loadtxt(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "digits.csv"), delimiter=",")
table = table[: len(table) // 2 * 2]  # the same number of steps on both ranks
x, y = distributed.shard(table[:, 1:].astype("float32") / settings.SCALE, table[:, 0].astype("int64"))
model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=distributed.optimizer(tf.keras.optimizers.Adam(0.01)),
              loss="sparse_categorical_crossentropy")
model.fit(x, y, batch_size=32, epochs=2, callbacks=distributed.callbacks(), verbose=0)
if distributed.is_leader():
    model.save(os.path.join(os.environ["SM_MODEL_DIR"], "model"))
"""


def installed(package: str) -> bool:
    return (Path(sysconfig.get_paths()["purelib"]) / f"{package}-1.0.dist-info").is_dir()


@pytest.fixture
def package():
    name = f"sm11_settings_{uuid.uuid4().hex[:8]}"
    yield name
    uninstall(name)


@pytest.fixture
def submitted(tmp_path, s3_server, package):  # noqa: F811
    """The SDK's upload: s3://.../source/sourcedir.tar.gz of src/."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT.format(package=package))
    wheel = write_wheel(source / "wheels", package, "1.0", "SCALE = 16.0\n")
    (source / "requirements.txt").write_text(f"./wheels/{wheel.name}\n")
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(source.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(source)), recursive=False)
    return s3_server.upload("sm11-sagemaker-us-east-1", "job-1/source/sourcedir.tar.gz", archive)


def test_source_dir_job_across_two_hosts_then_serve(
    make_job,
    submitted,
    s3_server,
    package,  # noqa: F811
    tmp_path,
):
    values = {
        **loopback_hyperparameters(timeout=120),
        "processes_per_host": 1,
        "sagemaker_submit_directory": json.dumps(submitted),
        "sagemaker_program": json.dumps("train.py"),
        "sagemaker_region": json.dumps("us-east-1"),
    }
    roots = {host: make_job(values, hosts=HOSTS, current=host) for host in HOSTS}
    env = {**os.environ, **s3_server.environment()}

    def start(host):
        return subprocess.Popen(
            [str(TRAIN), "--ml-root", str(roots[host])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=env,
        )

    worker = start("127.0.0.2")
    # Both "hosts" share this machine's Python: let the worker's pip finish before the
    # leader's runs (on SageMaker each host installs into its own).
    deadline = time.monotonic() + 120
    while not installed(package):
        assert worker.poll() is None, worker.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the worker never installed the requirements"
        time.sleep(0.2)
    leader = start("127.0.0.1")
    leader_output = leader.communicate(timeout=400)[0]
    worker_output = worker.communicate(timeout=60)[0]
    assert leader.returncode == 0, leader_output[-3000:]
    assert worker.returncode == 0, worker_output[-3000:]
    for host, output in (("127.0.0.1", leader_output), ("127.0.0.2", worker_output)):
        assert f"fetching the submit directory {submitted}" in output
        assert (roots[host] / "code" / "train.py").is_file()
        assert (roots[host] / "code" / "wheels").is_dir()
    model_dir = roots["127.0.0.1"] / "model"
    assert (model_dir / "model" / "saved_model.pb").is_file()
    assert not (model_dir / "metadata.json").exists()  # a plain model.save, nothing else

    table = np.loadtxt(
        roots["127.0.0.1"] / "input" / "data" / "validation" / "digits.csv", delimiter=","
    )
    labels, rows = table[:, 0].astype(int), table[:, 1:].astype(np.float32) / 16.0
    server = Server(roots["127.0.0.1"], tmp_path / "serve.log", SAGEMAKER_MODEL_SERVER_WORKERS="1")
    try:
        server.healthy()
        csv_body = "\n".join(",".join(f"{v:g}" for v in row) for row in rows)
        answer = server.answer(
            "POST",
            "/invocations",
            data=csv_body,
            headers={"Content-Type": "text/csv", "Accept": "text/csv"},
        )
        assert answer.status_code == 200, answer.text
        from_csv = np.loadtxt(answer.text.splitlines(), delimiter=",")
        assert from_csv.shape == (len(rows), 10)
        assert (from_csv.argmax(axis=1) == labels).mean() > 0.8
        answer = server.answer("POST", "/invocations", json={"instances": rows.tolist()})
        assert answer.status_code == 200, answer.text
        from_json = np.array(answer.json()["predictions"])
        np.testing.assert_allclose(from_json, from_csv, atol=1e-5)

        # Batch transform, SplitType=Line, BatchStrategy=MultiRecord, AssembleWith=Line:
        # records go in mini-batches, and the answers are joined with a newline each.
        lines = csv_body.split("\n")
        for accept in ("text/csv", "application/jsonlines"):
            answers = [
                server.answer(
                    "POST",
                    "/invocations",
                    data="\n".join(lines[i : i + 50]),
                    headers={"Content-Type": "text/csv", "Accept": accept},
                )
                for i in range(0, len(lines), 50)
            ]
            assert all(a.status_code == 200 for a in answers)
            assembled = "".join(a.text + "\n" for a in answers).splitlines()
            assert len(assembled) == len(lines) and all(assembled), accept

        # model.save kept Horovod's DistributedOptimizer, whose ops only Horovod registers.
        called = call_savedmodel(
            model_dir / "model", rows[:25], tmp_path, str(horovod_op_library())
        )
        (outputs,) = called["outputs"].values()
        np.testing.assert_allclose(outputs, from_json[:25], atol=1e-6)
    finally:
        server.stop()
