"""A small real Keras classifier, exported exactly as the trainer exports its model.

The model is a softmax over one dense layer with fixed weights, so tests compute the expected
probabilities with numpy (`expected_probabilities`) instead of trusting the server's answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from serve.app import create_app
from serve.batching import MicroBatcher
from serve.config import ServeConfig
from serve.limits import DecodeBudget

INPUT_SHAPE = (2, 2)
CLASSES = ["cat", "dog", "bird"]
KERNEL = (np.arange(12, dtype=np.float32).reshape(4, 3) - 6) / 4
BIAS = np.array([0.1, -0.2, 0.3], np.float32)
INSTANCES = [[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0], [-2.0, 0.25, 0.0, 3.0]]
METADATA = {"format": "keras-savedmodel", "model_path": "model", "input_shape": list(INPUT_SHAPE),
            "input_dtype": "float32", "task": "classification", "classes": CLASSES,
            "output": "probabilities", "feature_count": 4, "trained_epochs": 3}


def expected_probabilities(instances) -> np.ndarray:
    logits = np.asarray(instances, np.float64).reshape(-1, 4) @ KERNEL + BIAS
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def write_model(model_dir: Path, metadata: dict = METADATA) -> Path:
    """Export the fixed classifier exactly as the trainer does: SavedModel + metadata.json."""
    import tensorflow as tf

    inputs = tf.keras.Input(INPUT_SHAPE)
    dense = tf.keras.layers.Dense(len(CLASSES), activation="softmax")
    model = tf.keras.Model(inputs, dense(tf.keras.layers.Flatten()(inputs)))
    dense.set_weights([KERNEL, BIAS])
    model.save(str(model_dir / "model"), save_format="tf", include_optimizer=False)
    (model_dir / "metadata.json").write_text(json.dumps(metadata))
    return model_dir


def app_for(config: ServeConfig, model, predict=None):
    """The app a worker builds for `model` (its forward pass replaced by `predict` if given)."""
    batcher = MicroBatcher(predict or model.predict, config.max_batch_size, config.max_queue)
    return create_app(config, model, batcher, DecodeBudget(config.decode_budget_bytes))
