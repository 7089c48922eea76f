"""What one gunicorn worker serves: its own model, loading in the background, behind the app.

Built after fork, in the worker process, so the model (and TensorFlow) exists once per worker
and never in the gunicorn master.
"""

from __future__ import annotations

from flask import Flask

from serve.app import create_app
from serve.batching import MicroBatcher
from serve.config import ServeConfig
from serve.model import Model


def build_worker_app(config: ServeConfig) -> Flask:
    """The app of this worker; /ping answers 503 until the model has loaded and warmed up."""
    model = Model(config.model_dir)
    batcher = MicroBatcher(model.predict, config.max_batch_size,
                           config.max_batch_wait_ms / 1000).start()
    app = create_app(config, model, batcher)
    model.load_in_background()
    return app
