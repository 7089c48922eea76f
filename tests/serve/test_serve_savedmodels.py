"""Any TensorFlow SavedModel this image may have to serve, with or without metadata.json: the
layouts TensorFlow Serving reads, a Keras SavedModel without a signature, a script's plain
model.save, a model with several named inputs and outputs; TensorFlow Serving's JSON request
forms and answers. Real Keras models with fixed weights, so tests compute expectations with
numpy; the real app through Flask's test client."""

from __future__ import annotations

import json
import logging
import zipfile

import numpy as np
import pytest
from serve_testing import app_for

from job.metadata import ModelLoadError
from serve.config import ServeConfig
from serve.model import Model

KERNEL = np.array([[1.0, -1.0], [0.5, 2.0], [-2.0, 0.25]], np.float32)
ROWS = [[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]]


def linear(tf, scale: float = 1.0):
    """x @ (scale * KERNEL): one input of 3 values, one output of 2."""
    inputs = tf.keras.Input((3,), name="features")
    dense = tf.keras.layers.Dense(2, use_bias=False, name="scores")
    model = tf.keras.Model(inputs, dense(inputs))
    dense.set_weights([KERNEL * scale])
    return model


def two_by_two(tf):
    """Inputs a (2 values) and b (3 values); outputs total = sum(a) + sum(b), b_scaled = 2b."""
    a = tf.keras.Input((2,), name="a")
    b = tf.keras.Input((3,), name="b")
    sum_a = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(a)
    sum_b = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(b)
    total = tf.keras.layers.Add(name="total")([sum_a, sum_b])
    scaled = tf.keras.layers.Rescaling(2.0, name="b_scaled")(b)
    return tf.keras.Model({"a": a, "b": b}, {"total": total, "b_scaled": scaled})


@pytest.fixture(scope="module")
def tf():
    import tensorflow

    return tensorflow


def serve(model_dir):
    """The app serving `model_dir`, whose model must take the fast flat call (serve.model
    warns when it falls back to the public signature call)."""
    model = Model(model_dir)
    warnings: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warnings.append
    logger = logging.getLogger("serve.model")
    logger.addHandler(handler)
    try:
        model.load()
    finally:
        logger.removeHandler(handler)
    assert not warnings, [record.getMessage() for record in warnings]
    return app_for(ServeConfig(ml_root=model_dir.parent), model).test_client()


def post(client, body, content_type="application/json", accept="application/json"):
    answer = client.post(
        "/invocations",
        data=body if isinstance(body, (str, bytes)) else json.dumps(body),
        headers={"Content-Type": content_type, "Accept": accept},
    )
    return answer.status_code, answer.get_data(as_text=True)


def expected(scale=1.0):
    return np.array(ROWS) @ (KERNEL * scale)


@pytest.mark.parametrize("layout", ["model_dir", "version", "name/version", "name"])
def test_a_plain_model_save_in_any_layout_without_metadata(tf, tmp_path, layout):
    model_dir = tmp_path / "model"
    target = {
        "model_dir": model_dir,
        "version": model_dir / "3",
        "name/version": model_dir / "my-model" / "7",
        "name": model_dir / "my-model",
    }
    linear(tf).save(str(target[layout]))
    status, body = post(serve(model_dir), {"instances": ROWS})
    assert status == 200, body
    np.testing.assert_allclose(json.loads(body)["predictions"], expected(), rtol=1e-6)


def test_the_highest_numeric_version_wins(tf, tmp_path):
    model_dir = tmp_path / "model"
    for version, scale in (("2", 2.0), ("10", 10.0), ("9", 9.0)):
        linear(tf, scale).save(str(model_dir / "digits" / version))
    (model_dir / "digits" / "latest").mkdir()  # not a number: not a version
    status, body = post(serve(model_dir), {"instances": ROWS})
    np.testing.assert_allclose(json.loads(body)["predictions"], expected(10.0), rtol=1e-6)


def test_a_keras_savedmodel_without_a_signature(tf, tmp_path):
    """save_traces=False writes no serving_default: Keras rebuilds the model."""
    model_dir = tmp_path / "model"
    linear(tf).save(str(model_dir / "model"), save_traces=False)
    assert not tf.saved_model.load(str(model_dir / "model")).signatures
    client = serve(model_dir)
    status, body = post(client, "1,2,3\n0,-1,0.5", "text/csv", "text/csv")
    assert status == 200, body
    np.testing.assert_allclose(
        np.loadtxt(body.splitlines(), delimiter=",", ndmin=2), expected(), rtol=1e-6
    )


def test_metadata_classes_make_a_classifier_answer(tf, tmp_path):
    model_dir = tmp_path / "model"
    linear(tf).save(str(model_dir / "model" / "1"))
    (model_dir / "metadata.json").write_text(
        json.dumps({"model_path": "model", "classes": ["left", "right"]})
    )
    status, body = post(serve(model_dir), {"instances": ROWS})
    assert [p["class"] for p in json.loads(body)["predictions"]] == [
        ["left", "right"][i] for i in expected().argmax(axis=1)
    ]


def test_several_models_are_refused_naming_them(tf, tmp_path):
    model_dir = tmp_path / "model"
    for name in ("first", "second"):
        linear(tf).save(str(model_dir / name / "1"))
    with pytest.raises(
        ModelLoadError,
        match="holds several models \\(first, second\\); keep one, or add a metadata.json",
    ):
        Model(model_dir).load()


def test_a_script_s_keras_file_is_served_alone_or_named_by_metadata(tf, tmp_path):
    """model.save(".../model.keras"): the format keras.io's guides save (Keras 3 scripts can
    save no other; tests/image/test_keras_jax.py serves one trained on JAX)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    linear(tf, 3.0).save(str(model_dir / "digits.keras"))
    status, body = post(serve(model_dir), {"instances": ROWS})
    assert status == 200, body
    np.testing.assert_allclose(json.loads(body)["predictions"], expected(3.0), rtol=1e-6)
    linear(tf).save(str(model_dir / "other.keras"))
    with pytest.raises(ModelLoadError, match=r"several models \(digits.keras, other.keras\)"):
        Model(model_dir).load()
    (model_dir / "metadata.json").write_text(
        json.dumps({"model_path": "other.keras", "task": "regression"})
    )
    status, body = post(serve(model_dir), {"instances": ROWS})
    np.testing.assert_allclose(json.loads(body)["predictions"], expected(), rtol=1e-6)


def test_a_keras_file_this_image_cannot_read_says_why(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.keras").write_bytes(b"not a zip")
    with pytest.raises(ModelLoadError, match="model.keras is not a Keras model file"):
        Model(model_dir).load()
    with zipfile.ZipFile(model_dir / "model.keras", "w") as archive:  # as Keras 3 writes it
        archive.writestr("metadata.json", json.dumps({"keras_version": "3.15.1"}))
        archive.writestr("config.json", "{}")
    with pytest.raises(
        ModelLoadError,
        match="saved by Keras 3.15.1, which this image's Keras "
        "2.15.0 cannot read; serve it with the TensorFlow "
        "2.21 image",
    ):
        Model(model_dir).load()


def test_a_folder_without_any_savedmodel(tmp_path):
    (tmp_path / "model" / "notes").mkdir(parents=True)
    with pytest.raises(ModelLoadError, match="holds no TensorFlow SavedModel"):
        Model(tmp_path / "model").load()


@pytest.fixture(scope="module")
def multi(tf, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("multi") / "model"
    two_by_two(tf).save(str(model_dir / "pair" / "1"))
    return serve(model_dir)


A = [[1.0, 2.0], [3.0, 4.0]]
B = [[1.0, 0.0, -1.0], [0.5, 0.5, 0.5]]


def test_named_inputs_in_the_row_format(multi):
    status, body = post(multi, {"instances": [{"a": a, "b": b} for a, b in zip(A, B)]})
    assert status == 200, body
    assert json.loads(body) == {
        "predictions": [
            {"b_scaled": [2.0, 0.0, -2.0], "total": [3.0]},
            {"b_scaled": [1.0, 1.0, 1.0], "total": [8.5]},
        ]
    }


def test_named_inputs_in_json_lines(multi):
    body = "\n".join(json.dumps({"a": a, "b": b}) for a, b in zip(A, B))
    status, answer = post(multi, body, "application/jsonlines", "application/jsonlines")
    assert (status, answer) == (
        200,
        '{"b_scaled": [2.0, 0.0, -2.0], "total": [3.0]}\n'
        '{"b_scaled": [1.0, 1.0, 1.0], "total": [8.5]}',
    )


def test_named_inputs_in_the_columnar_format(multi):
    status, body = post(multi, {"inputs": {"a": A, "b": B}, "signature_name": "serving_default"})
    assert status == 200, body
    assert json.loads(body) == {
        "outputs": {"b_scaled": [[2.0, 0.0, -2.0], [1.0, 1.0, 1.0]], "total": [[3.0], [8.5]]}
    }


@pytest.mark.parametrize(
    "body, content_type, accept, status, message",
    [
        (
            {"inputs": {"a": A}},
            "application/json",
            "application/json",
            400,
            "the model's inputs are a, b; missing: b",
        ),
        (
            {"inputs": {"a": A, "b": B[:1]}},
            "application/json",
            "application/json",
            400,
            "every named input needs the same number of instances, got a: 2, b: 1",
        ),
        (
            {"instances": [{"a": A[0], "b": B[0]}, {"a": A[1]}]},
            "application/json",
            "application/json",
            400,
            "instance 1 does not name the same inputs as instance 0 (a, b)",
        ),
        (
            {"inputs": {"a": A, "b": [[1, 2], [3, 4]]}},
            "application/json",
            "application/json",
            400,
            "input 'b': each instance has shape [2], but the model expects [3]",
        ),
        (
            "1,2,3,4,5",
            "text/csv",
            "application/json",
            400,
            "the model has 2 inputs (a, b): send named inputs",
        ),
        (
            {"inputs": {"a": A, "b": B}},
            "application/json",
            "application/x-npy",
            406,
            "an .npy answer holds one array, but the model has 2 outputs (b_scaled, total)",
        ),
    ],
)
def test_named_input_mistakes(multi, body, content_type, accept, status, message):
    got_status, got = post(multi, body, content_type, accept)
    assert (got_status, json.loads(got)["error"][: len(message)]) == (status, message)


def test_batch_answers_have_one_line_per_record_and_no_trailing_newline(tf, tmp_path):
    model_dir = tmp_path / "model"
    linear(tf).save(str(model_dir))
    client = serve(model_dir)
    for accept in ("text/csv", "application/jsonlines"):
        status, body = post(client, "1,2,3\n0,-1,0.5\n", "text/csv", accept)
        assert status == 200 and not body.endswith("\n") and len(body.split("\n")) == 2, body


def test_an_integer_input_takes_whole_numbers_only(tf, tmp_path):
    """Token ids: an int32 input (its dtype from the signature), looked up in an embedding."""
    ids = tf.keras.Input((3,), dtype="int32", name="ids")
    embedding = tf.keras.layers.Embedding(5, 1, name="lookup")
    model = tf.keras.Model(ids, tf.keras.layers.Flatten()(embedding(ids)))
    embedding.set_weights([np.arange(5, dtype=np.float32).reshape(5, 1) * 10])
    model.save(str(tmp_path / "model" / "tokens" / "1"))
    client = serve(tmp_path / "model")
    assert post(client, {"instances": [{"ids": [4, 0, 2]}]}) == (
        200,
        json.dumps({"predictions": [[40.0, 0.0, 20.0]]}),
    )
    status, body = post(client, {"instances": [[1, 2.5, 3]]})
    assert (status, json.loads(body)["error"]) == (
        400,
        "instance 0 has a value at position [1] that is not representable as int32",
    )
