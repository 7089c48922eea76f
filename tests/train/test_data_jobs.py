"""Real 2-rank jobs on TFRecord shards and image folders, and serving the image model they
export (real mpirun, Horovod, `serve` on a real port)."""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import requests

from scripts.digits_files import png_images, split
from tests.conftest import failure_of, run_train

SERVE = os.path.join(os.path.dirname(sys.executable), "serve")


def test_two_ranks_read_their_own_tfrecord_shards_and_learn(make_job):
    root = make_job({"epochs": 3, "processes_per_host": 2, "learning_rate": 0.002,
                     "feature_key": "features"}, data="tfrecord")
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1437 training samples, 10 classes, sample shape (64,)" in result.stdout
    metadata = json.loads((root / "model" / "metadata.json").read_text())
    assert metadata["input_shape"] == [64] and metadata["classes"] == list(range(10))
    assert metadata["final_metrics"]["val_accuracy"] > 0.9


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_image_model_trained_on_an_image_folder_is_served_on_npy_and_json(make_job, tmp_path):
    root = make_job({"epochs": 1, "processes_per_host": 2, "model": "mobilenet_v2",
                     "augment": "true"}, data="images")
    result = run_train(root, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "sample shape (32, 32, 1)" in result.stdout
    metadata = json.loads((root / "model" / "metadata.json").read_text())
    assert metadata["input_shape"] == [32, 32, 1]
    assert metadata["classes"] == [str(d) for d in range(10)]

    import tensorflow as tf
    pixels, labels = split()["validation"]
    images = np.stack([tf.io.decode_png(png).numpy() for png in png_images(pixels[:4], 32)])
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([SERVE, "--ml-root", str(root)], stdout=log, stderr=log,
                              start_new_session=True,
                              env={**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "serve never answered /ping with 200"
            try:
                if requests.get(url + "/ping", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        buffer = io.BytesIO()
        np.save(buffer, images.astype(np.float32))
        by_npy = requests.post(url + "/invocations", data=buffer.getvalue(), timeout=60,
                               headers={"Content-Type": "application/x-npy",
                                        "Accept": "application/json"})
        by_json = requests.post(url + "/invocations", timeout=60,
                                json={"instances": images.astype(float).tolist()})
        assert by_npy.status_code == 200 and by_json.status_code == 200, by_npy.text
        assert by_npy.json() == by_json.json()
        predictions = by_json.json()["predictions"]
        assert len(predictions) == 4 and all(p["class"] in metadata["classes"]
                                             for p in predictions)
        wrong = requests.post(url + "/invocations", json={"instances": [[0.0] * 64]}, timeout=60)
        assert wrong.status_code == 400
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def test_an_undecodable_image_fails_the_job_naming_the_file(make_job):
    root = make_job({"epochs": 1, "processes_per_host": 2, "model": "cnn"}, data="images")
    (root / "input" / "data" / "train" / "7" / "scan.png").write_bytes(b"\x89PNG truncated")
    result = run_train(root)
    assert result.returncode != 0
    assert "7/scan.png: not a decodable JPEG or PNG image" in failure_of(root)
    assert "replace or delete the file" in failure_of(root)
