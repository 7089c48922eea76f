"""Fixtures: the test classifier in a model directory, loaded once, and the app serving it."""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_testing import INTAKE_THREADS, INTAKE_TIMEOUT_S, Server, app_for, write_model

from serve.config import ServeConfig
from serve.model import Model


@pytest.fixture(scope="session")
def ml_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ml")
    write_model(root / "model")
    return root


@pytest.fixture(scope="session")
def config(ml_root) -> ServeConfig:
    return ServeConfig(ml_root=ml_root, max_payload_mb=1, max_batch_size=8, timeout_s=30)


@pytest.fixture(scope="session")
def loaded_model(config) -> Model:
    model = Model(config.model_dir)
    model.load()
    return model


@pytest.fixture(scope="session")
def app(config, loaded_model):
    return app_for(config, loaded_model)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture(scope="session")
def intake_server(ml_root, tmp_path_factory) -> Server:
    """A real `serve` of one worker with INTAKE_THREADS request threads and an INTAKE_TIMEOUT_S
    request timeout, for the tests of what reaches its intake (slow clients, bad framing). One
    for the session: starting one takes 10 to 50 s on a busy 2-core machine."""
    server = Server(
        ml_root,
        tmp_path_factory.mktemp("intake") / "serve.log",
        SAGEMAKER_MODEL_SERVER_WORKERS="1",
        SERVE_THREADS=str(INTAKE_THREADS),
        SAGEMAKER_MODEL_SERVER_TIMEOUT=str(INTAKE_TIMEOUT_S),
    )
    server.healthy()
    yield server
    server.stop()
