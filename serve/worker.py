"""What one gunicorn worker serves: its own model, loading in the background, behind the app.

Built after fork, in the worker process, so the model (and TensorFlow) exists once per worker
and never in the gunicorn master. TensorFlow's thread pools and kernels are chosen
(serve.host) before TensorFlow is imported; variables already set win.
"""

from __future__ import annotations

import os

from flask import Flask

from serve.app import create_app
from serve.batching import MicroBatcher, Predict
from serve.config import ServeConfig
from serve.host import cpu_count, tensorflow_environment
from serve.limits import DecodeBudget
from serve.model import Model


def build_worker_app(config: ServeConfig) -> Flask:
    """The app of this worker; /ping answers 503 until the model has loaded and warmed up."""
    for name, value in tensorflow_environment(cpu_count()).items():
        os.environ.setdefault(name, value)
    model = Model(config.model_dir)
    app = assemble_app(config, model, model.predict)
    model.load_in_background()
    return app


def assemble_app(config: ServeConfig, model: Model, predict: Predict) -> Flask:
    """The app and its parts: `predict` behind the batcher, bodies within the decode budget."""
    batcher = MicroBatcher(predict, config.max_batch_size, config.max_queue)
    return create_app(config, model, batcher, DecodeBudget(config.decode_budget_bytes))
