"""The SDK's source_dir in real containers: a 2-container compose job whose hyperparameters
name a sourcedir.tar.gz mounted into each container (file://), as a job names its S3 upload.
Each container unpacks it into /opt/ml/code and pip-installs its requirements.txt (a wheel
inside it, no index) before the ranks start; the script trains across both and saves with a
plain model.save, and `serve` from the image answers with that model."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
from conftest import compose_cluster, http, local_cluster, serving

from tests.container.test_sdk_flow import SCRIPT
from tests.s3_server import write_wheel

pytestmark = pytest.mark.container

ARCHIVE = "/mnt/source/sourcedir.tar.gz"


def test_a_source_dir_job_in_two_containers_then_serve(engine, image, digits, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT.format(package="sm11_settings"))
    wheel = write_wheel(source / "wheels", "sm11_settings", "1.0", "SCALE = 16.0\n")
    (source / "requirements.txt").write_text(f"./wheels/{wheel.name}\n")
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(source.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(source)), recursive=False)
    spec = local_cluster.ClusterSpec(
        hosts=2,
        workdir=tmp_path / "cluster",
        data=digits,
        image=image,
        hyperparameters={
            "sagemaker_submit_directory": json.dumps(f"file://{ARCHIVE}"),
            "sagemaker_program": json.dumps("train.py"),
            "processes_per_host": "1",
        },
    )

    def mount_archive(document):
        for service in document["services"].values():
            service["volumes"].append(f"{archive}:{ARCHIVE}:ro")

    with compose_cluster(engine, spec, "sourcedir", edit=mount_archive) as cluster:
        cluster.compose("up", "--abort-on-container-exit", check=False, capture=True, timeout=900)
        codes = cluster.wait_all_exited(120)
        logs = {host: cluster.logs(host) for host in cluster.containers()}
    everything = "\n".join(f"--- {h}\n{text[-3000:]}" for h, text in logs.items())
    assert codes == {"algo-1": 0, "algo-2": 0}, everything
    for host in ("algo-1", "algo-2"):
        assert f"fetching the submit directory file://{ARCHIVE}" in logs[host], everything
        assert "Successfully installed sm11-settings-1.0" in logs[host], everything
    model = local_cluster.host_paths(spec, "algo-1").model_dir
    assert (model / "model" / "saved_model.pb").is_file() and not (model / "metadata.json").exists()

    with serving(engine, image, model) as url:
        rows = np.loadtxt(digits / "validation" / "digits.csv", delimiter=",")[:40]
        body = "\n".join(",".join(f"{v / 16:g}" for v in row[1:]) for row in rows).encode()
        status, answer = http(
            "POST",
            f"{url}/invocations",
            body,
            {"Content-Type": "text/csv", "Accept": "text/csv"},
            timeout=60,
        )
        assert status == 200, answer
        lines = answer.decode().split("\n")  # no trailing newline: one line per record
        assert len(lines) == 40 and all(len(line.split(",")) == 10 for line in lines)
        predicted = np.array([[float(v) for v in line.split(",")] for line in lines])
        assert (predicted.argmax(axis=1) == rows[:, 0]).mean() > 0.6
