"""Settings from the environment, the gunicorn settings built from them, and the `serve` CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import serve.server as server_module
from serve.cli import parse_args
from serve.config import ServeConfig, ServeConfigError, config_from_env
from serve.host import (
    WorkerSlots,
    cpu_count,
    default_workers,
    gpu_count,
    lowest_free,
    tensorflow_environment,
    worker_core,
)
from serve.logs import logging_config
from serve.server import NoAccessLogger, gunicorn_options


def test_defaults_suit_sagemaker_and_the_host():
    config = config_from_env(Path("/opt/ml"), {})
    workers = default_workers(cpu_count(), gpu_count())
    assert config == ServeConfig(
        ml_root=Path("/opt/ml"),
        port=8080,
        workers=workers,
        threads=80,
        timeout_s=60,
        max_payload_mb=6,
        max_concurrent_transforms=0,
        max_batch_size=128,
        max_queue=64,
        decode_mb=0,
    )
    assert config.model_dir == Path("/opt/ml/model")
    assert config.max_payload_bytes == 6 * 1024 * 1024
    assert config.decode_budget_bytes == 12 * 1024 * 1024
    assert config.concurrent_transforms == 8 * workers


def test_workers_fill_the_host_and_each_call_may_use_every_core(tmp_path):
    assert gpu_count(tmp_path / "no-driver") == 0
    for gpu in ("0000:00:1e.0", "0000:00:1f.0"):
        (tmp_path / gpu).mkdir()
    assert gpu_count(tmp_path) == 2
    assert default_workers(cpus=8, gpus=0) == 8
    assert default_workers(cpus=8, gpus=2) == 2
    assert tensorflow_environment(cpus=8) == {
        "TF_NUM_INTRAOP_THREADS": "8",
        "TF_NUM_INTEROP_THREADS": "1",
        "OMP_NUM_THREADS": "8",
        "TF_ENABLE_ONEDNN_OPTS": "0",
    }
    assert [worker_core(slot, {5, 3, 9}) for slot in range(4)] == [3, 5, 9, 3]
    assert lowest_free([]) == 0
    assert lowest_free([0]) == 1
    assert lowest_free([1]) == 0  # the worker that held slot (and GPU) 0 was replaced
    assert lowest_free([0, 2]) == 1


def test_each_worker_gets_a_slot_its_replacement_inherits():
    """The master's hooks (WorkerSlots.assign before fork, .free on exit): a slot is the
    worker's GPU on a GPU host, so a replacement must take the slot of the worker that exited."""
    slots, arbiter = WorkerSlots(), SimpleNamespace()
    workers = [SimpleNamespace() for _ in range(3)]
    for worker in workers:
        slots.assign(arbiter, worker)
    assert [worker.slot for worker in workers] == [0, 1, 2]
    slots.free(arbiter, workers[1])
    replacement = SimpleNamespace()
    slots.assign(arbiter, replacement)
    assert replacement.slot == 1
    slots.assign(arbiter, fourth := SimpleNamespace())
    assert fourth.slot == 3


def test_every_setting_comes_from_its_variable():
    env = {
        "SAGEMAKER_BIND_TO_PORT": "9000",
        "SAGEMAKER_MODEL_SERVER_WORKERS": "2",
        "SERVE_THREADS": "16",
        "SAGEMAKER_MODEL_SERVER_TIMEOUT": "30",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "0",
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "4",
        "SERVE_MAX_BATCH_SIZE": "64",
        "SERVE_MAX_QUEUE": " 7 ",
        "SERVE_DECODE_MB": "3",
    }
    config = config_from_env(Path("/ml"), env)
    assert config == ServeConfig(
        ml_root=Path("/ml"),
        port=9000,
        workers=2,
        threads=16,
        timeout_s=30,
        max_payload_mb=0,
        max_concurrent_transforms=4,
        max_batch_size=64,
        max_queue=7,
        decode_mb=3,
    )
    assert config.max_payload_bytes is None  # 0: no limit
    assert config.decode_budget_bytes == 3 * 1024 * 1024
    assert config.concurrent_transforms == 4


@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "SAGEMAKER_MODEL_SERVER_WORKERS",
            "two",
            "SAGEMAKER_MODEL_SERVER_WORKERS='two' is not an integer",
        ),
        (
            "SAGEMAKER_BIND_TO_PORT",
            "70000",
            "SAGEMAKER_BIND_TO_PORT=70000 is out of range: expected 1 to 65535",
        ),
        (
            "SAGEMAKER_MAX_PAYLOAD_IN_MB",
            "101",
            "SAGEMAKER_MAX_PAYLOAD_IN_MB=101 is out of range: expected 0 to 100",
        ),
        (
            "SAGEMAKER_MODEL_SERVER_TIMEOUT",
            "1.5",
            "SAGEMAKER_MODEL_SERVER_TIMEOUT='1.5' is not an integer",
        ),
        ("SERVE_MAX_QUEUE", "0", "SERVE_MAX_QUEUE=0 is out of range: expected 1 to 65536"),
        (
            "SERVE_MAX_BATCH_SIZE",
            "0",
            "SERVE_MAX_BATCH_SIZE=0 is out of range: expected 1 to 1000000",
        ),
    ],
)
def test_a_bad_value_names_the_variable_and_what_is_allowed(name, value, message):
    with pytest.raises(ServeConfigError) as error:
        config_from_env(Path("/opt/ml"), {name: value})
    assert str(error.value) == message


def test_gunicorn_settings():
    config = ServeConfig(port=9000, workers=2, threads=16, timeout_s=30)
    options = gunicorn_options(config, upstream_port=9001)
    slots = options.pop("pre_fork").__self__
    assert isinstance(slots, WorkerSlots) and options.pop("child_exit") == slots.free
    assert options.pop("post_worker_init") == server_module._pin_python
    assert options == {
        "bind": ["127.0.0.1:9001"],
        "reuse_port": True,
        "workers": 2,
        "worker_class": "gthread",
        "threads": 16,
        "timeout": 30,
        "graceful_timeout": 20,
        "keepalive": 75,
        "preload_app": False,
        "accesslog": None,
        "logger_class": NoAccessLogger,
        "logconfig_dict": logging_config(),
        "control_socket_disable": True,
        "proc_name": "serve",
    }


def test_cli_reads_ml_root_and_environment(monkeypatch):
    monkeypatch.setenv("SAGEMAKER_BIND_TO_PORT", "8123")
    config = parse_args(["--ml-root", "/tmp/job"])
    assert (config.ml_root, config.port) == (Path("/tmp/job"), 8123)
    assert parse_args([]).ml_root == Path("/opt/ml")


def test_cli_refuses_a_bad_environment_with_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("SERVE_THREADS", "lots")
    with pytest.raises(SystemExit) as exit_:
        parse_args([])
    assert exit_.value.code == 2
    assert "serve: error: SERVE_THREADS='lots' is not an integer" in capsys.readouterr().err


def test_on_a_gpu_host_each_worker_sees_the_gpu_of_its_slot(monkeypatch):
    monkeypatch.setattr(server_module, "gpu_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    options = gunicorn_options(ServeConfig(port=9000, workers=2), upstream_port=9001)
    for slot, gpu in ((0, "0"), (1, "1"), (2, "0")):  # a third worker shares round robin
        options["post_fork"](SimpleNamespace(), SimpleNamespace(slot=slot))
        assert os.environ["CUDA_VISIBLE_DEVICES"] == gpu


def test_a_port_another_process_holds_is_refused_at_start_naming_it(tmp_path):
    """The workers bind with SO_REUSEPORT; without the master's check they would fail and be
    restarted forever on a port another program holds."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [str(Path(sys.executable).parent / "serve"), "--ml-root", str(tmp_path)],
            env={**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert (
        f"serve: error: port {port} is in use by another process; stop it or choose "
        "another port with SAGEMAKER_BIND_TO_PORT"
    ) in result.stderr
