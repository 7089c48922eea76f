"""Loading: every way a model directory can be unservable says so; a regressor's raw outputs."""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from serve_testing import INSTANCES, METADATA, app_for, expected_probabilities

from job.metadata import ModelLoadError, ModelMetadata
from serve.config import ServeConfig
from serve.errors import ModelUnavailable
from serve.model import Model, _flat_call


def with_metadata(model_dir, **changes) -> None:
    document = {key: value for key, value in {**METADATA, **changes}.items() if value is not None}
    (model_dir / "metadata.json").write_text(json.dumps(document))


@pytest.fixture
def model_dir(ml_root, tmp_path):
    """A copy of the test model's directory whose metadata.json a test may change."""
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "model").symlink_to(ml_root / "model" / "model")
    with_metadata(directory)
    return directory


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"format": "onnx"},
            "metadata.json: format 'onnx' is not supported; expected 'keras-savedmodel'",
        ),
        (
            {"input_shape": []},
            "metadata.json: input_shape must be a non-empty list of positive "
            "integers (one instance, no batch dimension), got []",
        ),
        (
            {"input_shape": [8, 0]},
            "metadata.json: input_shape must be a non-empty list of positive "
            "integers (one instance, no batch dimension), got [8, 0]",
        ),
        (
            {"classes": []},
            'metadata.json: a classification model needs "classes", the non-empty '
            "list of labels in output order, got []",
        ),
        (
            {"output": "logits"},
            "metadata.json: output 'logits' is not supported for a classifier; "
            'expected "probabilities"',
        ),
        ({"model_path": 7}, "metadata.json: model_path must be a path relative to {dir}, got 7"),
    ],
)
def test_bad_metadata_says_which_key_is_wrong(model_dir, changes, message):
    with_metadata(model_dir, **changes)
    with pytest.raises(ModelLoadError) as error:
        ModelMetadata.read(model_dir)
    assert str(error.value) == message.format(dir=model_dir)


def test_metadata_that_is_not_json(model_dir):
    (model_dir / "metadata.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"metadata.json cannot be read as JSON: Expecting"):
        ModelMetadata.read(model_dir)


def test_unknown_metadata_keys_are_ignored(model_dir):
    with_metadata(model_dir, final_metrics={"accuracy": 0.9}, tensorflow="2.15.1")
    assert ModelMetadata.read(model_dir).input_shape == (2, 2)


@pytest.mark.parametrize(
    "setup, message",
    [
        (
            "missing",
            "the SavedModel directory {dir}/elsewhere named by metadata.json model_path "
            "does not exist",
        ),
        ("empty", "{dir}/empty is not a loadable SavedModel: "),
        ("classes", "the model outputs shape [3] per instance, but metadata.json lists 4 classes"),
    ],
)
def test_an_unservable_model_fails_to_load_with_the_reason(model_dir, setup, message):
    if setup == "missing":
        with_metadata(model_dir, model_path="elsewhere")
    elif setup == "empty":
        (model_dir / "empty").mkdir()
        with_metadata(model_dir, model_path="empty")
    else:
        with_metadata(model_dir, classes=["a", "b", "c", "d"])
    model = Model(model_dir)
    with pytest.raises(ModelLoadError) as error:
        model.load()
    assert str(error.value).startswith(message.format(dir=model_dir))
    assert not model.ready


CHECK_IMPORTS = """
import sys
from pathlib import Path
import serve.worker
from serve.model import Model, _flat_call
try:
    Model(Path(sys.argv[1])).load()
except Exception as error:
    print(error)
print("tensorflow" in sys.modules)
"""


def test_metadata_problems_are_found_before_tensorflow_is_imported(tmp_path):
    """A missing model is reported at once, and the app's modules never import TensorFlow."""
    output = subprocess.run(
        [sys.executable, "-c", CHECK_IMPORTS, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert output[0].startswith("no model to serve:")
    assert output[1] == "False"


def test_predict_before_the_model_has_loaded_says_why(tmp_path):
    """A caller that does not wait for `ready` is told what /ping would say (503), while the
    model loads and after it failed, rather than failing on the interface it does not have."""
    model = Model(tmp_path / "model")
    batch = np.zeros((1, 4), np.float32)
    with pytest.raises(ModelUnavailable, match="^the model is still loading; retry when"):
        model.predict(batch)
    model.load_in_background().join()
    with pytest.raises(ModelUnavailable, match="^the model failed to load: no model to serve"):
        model.predict(batch)


def test_a_model_that_is_not_a_classifier_returns_its_outputs(model_dir):
    with_metadata(model_dir, task="regression", classes=None, output=None)
    model = Model(model_dir)
    model.load()
    client = app_for(ServeConfig(ml_root=model_dir.parent), model).test_client()
    expected = expected_probabilities(INSTANCES)
    body = json.dumps(INSTANCES)
    answer = client.post("/invocations", data=body, content_type="application/json")
    np.testing.assert_allclose(answer.get_json()["predictions"], expected, rtol=1e-5)
    answer = client.post(
        "/invocations", data=body, content_type="application/json", headers={"Accept": "text/csv"}
    )
    np.testing.assert_allclose(
        np.loadtxt(answer.get_data(as_text=True).splitlines(), delimiter=",", ndmin=2),
        expected,
        rtol=1e-5,
    )


def test_metadata_written_is_read_back_unchanged(tmp_path):
    """The one ModelMetadata: what the exporter writes is what the server reads."""
    written = ModelMetadata(
        model_path="model/1",
        input_shape=(8, 8, 1),
        classes=("a", 2),
        info={"final_metrics": {"accuracy": 0.5}, "tensorflow": "2.15.1"},
    )
    written.write(tmp_path)
    assert ModelMetadata.read(tmp_path) == written
    regressor = ModelMetadata(classes=None)
    regressor.write(tmp_path)
    assert ModelMetadata.read(tmp_path) == regressor
    assert ModelMetadata.read(tmp_path / "nowhere") is None


def test_the_model_is_called_through_its_flat_function_and_its_objects_frozen(model_dir, caplog):
    """With the pinned TensorFlow the flat call answers as the signature does (no warning),
    and TensorFlow's objects leave the collector's full passes once the model is loaded."""
    gc.unfreeze()
    with caplog.at_level(logging.WARNING, logger="serve.model"):
        model = Model(model_dir)
        model.load()
    assert not caplog.records, caplog.text
    assert gc.get_freeze_count() > 100_000
    batch = np.array(INSTANCES, np.float32).reshape(-1, 2, 2)
    np.testing.assert_allclose(model.predict(batch), expected_probabilities(INSTANCES), rtol=1e-5)


class _Skewed:
    """A real signature whose public call answers twice what its flat function does."""

    def __init__(self, signature):
        self._signature = signature
        self.structured_input_signature = signature.structured_input_signature
        self.structured_outputs = signature.structured_outputs
        self.captured_inputs = signature.captured_inputs
        self._inference_function = signature._inference_function

    def __call__(self, **feed):
        return {name: 2 * output for name, output in self._signature(**feed).items()}


def test_a_flat_function_that_answers_differently_is_not_used(loaded_model, caplog):
    import tensorflow as tf

    signature = tf.saved_model.load(str(loaded_model.model_dir / "model")).signatures[
        "serving_default"
    ]
    with caplog.at_level(logging.WARNING, logger="serve.model"):
        assert _flat_call(_Skewed(signature), loaded_model.interface.inputs) is None
    assert "answers differently; using the public call" in caplog.text
    assert _flat_call(signature, loaded_model.interface.inputs) is not None
