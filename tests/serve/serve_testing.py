"""A small real Keras classifier, exported exactly as the trainer exports its model.

The model is a softmax over one dense layer with fixed weights, so tests compute the expected
probabilities with numpy (`expected_probabilities`) instead of trusting the server's answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import requests

from container.network import free_port
from serve.config import ServeConfig
from serve.worker import assemble_app
from tests.waiting import eventually

INPUT_SHAPE = (2, 2)
CLASSES = ["cat", "dog", "bird"]
KERNEL = (np.arange(12, dtype=np.float32).reshape(4, 3) - 6) / 4
BIAS = np.array([0.1, -0.2, 0.3], np.float32)
INSTANCES = [[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0], [-2.0, 0.25, 0.0, 3.0]]
METADATA = {
    "format": "keras-savedmodel",
    "model_path": "model",
    "input_shape": list(INPUT_SHAPE),
    "input_dtype": "float32",
    "task": "classification",
    "classes": CLASSES,
    "output": "probabilities",
    "feature_count": 4,
    "trained_epochs": 3,
}


def expected_probabilities(instances) -> np.ndarray:
    logits = np.asarray(instances, np.float64).reshape(-1, 4) @ KERNEL + BIAS
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def write_model(model_dir: Path, metadata: dict = METADATA) -> Path:
    """Export the fixed classifier exactly as the trainer does: SavedModel + metadata.json."""
    import tensorflow as tf

    # Named as Keras names a process's first input, whichever models other tests built before.
    inputs = tf.keras.Input(INPUT_SHAPE, name="input_1")
    dense = tf.keras.layers.Dense(len(CLASSES), activation="softmax")
    model = tf.keras.Model(inputs, dense(tf.keras.layers.Flatten()(inputs)))
    dense.set_weights([KERNEL, BIAS])
    model.save(str(model_dir / "model"), save_format="tf", include_optimizer=False)
    (model_dir / "metadata.json").write_text(json.dumps(metadata))
    return model_dir


def app_for(config: ServeConfig, model, predict=None):
    """The app a worker builds for `model` (its forward pass replaced by `predict` if given)."""
    return assemble_app(config, model, predict or model.predict)


SERVE = Path(sys.executable).parent / "serve"
INTAKE_THREADS = 2  # the request threads of the `intake_server` fixture's one worker
INTAKE_TIMEOUT_S = 5  # and its request timeout
DEADLINE_S = 300  # generous: loading TensorFlow on a busy 2-core machine takes a while


def wait_for(condition, what: str, timeout_s: float = DEADLINE_S):
    """Poll `condition` until it returns something other than None or False; return that (a
    response body of b"" or a count of 0 is an answer here, so the value travels boxed through
    `eventually`, which waits for a truthy one)."""

    def answered():
        result = condition()
        return None if result is None or result is False else (result,)

    return eventually(answered, f"{what} did not happen within {timeout_s} s", timeout_s)[0]


class Server:
    """A `serve` process on a free port, its log in a file."""

    def __init__(self, ml_root: Path, log: Path, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("w") as stderr:
            self.process = subprocess.Popen(
                [str(SERVE), "--ml-root", str(ml_root)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
                env={**os.environ, "SAGEMAKER_BIND_TO_PORT": str(self.port), **env},
            )

    def answer(self, method: str, path: str, **kwargs) -> requests.Response | None:
        """The server's answer, or None while it does not accept connections yet."""
        assert self.process.poll() is None, f"serve exited: {self.log.read_text()[-3000:]}"
        try:
            return requests.request(method, self.url + path, timeout=30, **kwargs)
        except requests.ConnectionError:
            return None

    def healthy(self) -> None:
        wait_for(
            lambda: getattr(self.answer("GET", "/ping"), "status_code", 0) == 200,
            f"/ping answering 200 (log: {self.log})",
        )

    def models_ready(self, workers: int) -> None:
        """Wait until each of `workers` workers has said, on /metrics, that its model is ready:
        /ping answers 200 as soon as one worker's is."""
        ready: set[int] = set()

        def all_ready() -> bool:
            answer = self.answer("GET", "/metrics")
            if answer is not None and answer.json()["model_ready"]:
                ready.add(answer.json()["pid"])
            return len(ready) == workers

        wait_for(all_ready, f"the models of {workers} workers ready (log: {self.log})")

    def stop(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        return self.process.wait(timeout=60)
