"""Real 2-rank jobs on TFRecord shards and image folders, and serving the image model they
export (real mpirun, Horovod, `serve` on a real port)."""

import io
import json

import numpy as np
import pytest

from scripts.digits_files import png_images, split
from tests.conftest import failure_of, run_train
from tests.serve.serve_testing import Server


def test_two_ranks_read_their_own_tfrecord_shards_and_learn(make_job):
    root = make_job(
        {"epochs": 3, "processes_per_host": 2, "learning_rate": 0.002, "feature_key": "features"},
        data="tfrecord",
    )
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1437 training samples, 10 classes, sample shape (64,)" in result.stdout
    metadata = json.loads((root / "model" / "metadata.json").read_text())
    assert metadata["input_shape"] == [64] and metadata["classes"] == list(range(10))
    assert metadata["final_metrics"]["val_accuracy"] > 0.9


@pytest.mark.slow
def test_an_image_model_trained_on_an_image_folder_is_served_on_npy_and_json(make_job, tmp_path):
    # One rank, 16 images a class: mobilenet_v2 is costly to build, trace and export (two
    # ranks reading an image folder: the undecodable-image test below)
    root = make_job(
        {"epochs": 1, "processes_per_host": 1, "model": "mobilenet_v2", "augment": "true"},
        data="images",
    )
    for channel in ("train", "validation"):
        for folder in (root / "input" / "data" / channel).iterdir():
            for surplus in sorted(folder.iterdir())[16:]:
                surplus.unlink()
    result = run_train(root, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "sample shape (32, 32, 1)" in result.stdout
    metadata = json.loads((root / "model" / "metadata.json").read_text())
    assert metadata["input_shape"] == [32, 32, 1]
    assert metadata["classes"] == [str(d) for d in range(10)]

    import tensorflow as tf

    pixels, labels = split()["validation"]
    images = np.stack([tf.io.decode_png(png).numpy() for png in png_images(pixels[:4], 32)])
    server = Server(root, tmp_path / "serve.log", SAGEMAKER_MODEL_SERVER_WORKERS="1")
    try:
        server.healthy()
        buffer = io.BytesIO()
        np.save(buffer, images.astype(np.float32))
        by_npy = server.answer(
            "POST",
            "/invocations",
            data=buffer.getvalue(),
            headers={"Content-Type": "application/x-npy", "Accept": "application/json"},
        )
        by_json = server.answer(
            "POST", "/invocations", json={"instances": images.astype(float).tolist()}
        )
        assert by_npy.status_code == 200 and by_json.status_code == 200, by_npy.text
        assert by_npy.json() == by_json.json()
        predictions = by_json.json()["predictions"]
        assert len(predictions) == 4 and all(p["class"] in metadata["classes"] for p in predictions)
        wrong = server.answer("POST", "/invocations", json={"instances": [[0.0] * 64]})
        assert wrong.status_code == 400
    finally:
        server.stop()


def test_an_undecodable_image_fails_the_job_naming_the_file(make_job):
    root = make_job({"epochs": 1, "processes_per_host": 2, "model": "cnn"}, data="images")
    (root / "input" / "data" / "train" / "7" / "scan.png").write_bytes(b"\x89PNG truncated")
    result = run_train(root)
    assert result.returncode == 2
    assert "7/scan.png: not a decodable JPEG or PNG image" in failure_of(root)
    assert "replace or delete the file" in failure_of(root)
