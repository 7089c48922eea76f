"""The job's MLflow run (container.mlflow_run, job.tracking) against a real MLflow tracking
server on loopback (`mlflow server` from .venv-mlflow), read back with MLflow's own client:
the built-in trainer across two hosts, a user's script that logs with the `mlflow` package,
a server that cannot be reached, a managed server's ARN."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid

import pytest
from mlflow.tracking import MlflowClient

from container.network import free_port
from job.errors import ConfigError
from job.tracking import Tracking, experiment_id
from tests.conftest import ROOT, failure_of, run_train, stop_job
from tests.container.test_multi_host import HOSTS, cluster, start  # noqa: F401

SERVER_START = 240  # seconds: the first start of a fresh server migrates its database


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """The URL of a real MLflow tracking server on a free loopback port."""
    subprocess.run(["bash", "scripts/setup_sdk.sh", "mlflow"], cwd=ROOT, check=True)
    folder = tmp_path_factory.mktemp("mlflow")
    log = (folder / "server.log").open("w")
    port = free_port()
    server = subprocess.Popen(
        [
            str(ROOT / ".venv-mlflow" / "bin" / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{folder}/runs.db",
            "--default-artifact-root",
            str(folder / "artifacts"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # MLflow 3's server also starts a pool of job consumers (huey: five processes) for
        # features the job never uses; they cost the machine CPU and the teardown its time
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START
    while True:
        assert server.poll() is None, (folder / "server.log").read_text()[-3000:]
        assert time.monotonic() < deadline, (folder / "server.log").read_text()[-3000:]
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            break
        except OSError:
            time.sleep(0.5)
    yield url
    # The server is a tool of the tests, not the product: under a loaded machine its gunicorn
    # has outlasted 30 s of SIGTERM (its workers finishing requests), so it is killed then.
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def tracked(url: str, **more: str) -> dict[str, str]:
    """A job environment naming the server and an experiment of its own."""
    return {
        "MLFLOW_TRACKING_URI": url,
        "MLFLOW_EXPERIMENT_NAME": f"test-{uuid.uuid4().hex}",
        **more,
    }


def runs_of(url: str, env: dict[str, str]) -> list:
    client = MlflowClient(url)
    experiment = client.get_experiment_by_name(env["MLFLOW_EXPERIMENT_NAME"])
    assert experiment is not None, "the job made no experiment"
    return client.search_runs([experiment.experiment_id])


def test_the_built_in_trainer_logs_one_run_from_the_leader(cluster, mlflow_server):
    env = tracked(mlflow_server, TRAINING_JOB_NAME="digits-mlflow-1")
    roots = cluster({"epochs": 2})
    worker = start(roots[HOSTS[1]], env)
    leader = start(roots[HOSTS[0]], env)
    output = leader.communicate(timeout=300)[0]
    worker.communicate(timeout=30)
    assert leader.returncode == worker.returncode == 0, output[-3000:]
    [run] = runs_of(mlflow_server, env)  # one run, whichever host logs
    assert f"launcher: MLflow run {run.info.run_id} in experiment" in output
    assert (run.info.status, run.info.run_name) == ("FINISHED", "digits-mlflow-1")
    params = run.data.params
    assert (params["epochs"], params["world_size"], params["processes_per_host"]) == ("2", "2", "1")
    assert float(params["scaled_learning_rate"]) > 0
    tags = run.data.tags
    assert tags["sagemaker.hosts"] == ",".join(HOSTS)
    assert tags["sagemaker.training_job_name"] == "digits-mlflow-1"
    assert tags["mlflow.source.name"] == "built-in trainer"
    leader_root = roots[HOSTS[0]]
    assert tags["model.location"].startswith(str(leader_root / "model"))
    # every epoch's numbers, as the job's own history has them
    history = json.loads((leader_root / "output" / "data" / "history.json").read_text())
    client = MlflowClient(mlflow_server)
    for key in ("loss", "accuracy", "lr", "samples_per_sec"):
        points = client.get_metric_history(run.info.run_id, key)
        assert [p.step for p in points] == [1, 2], key
        assert [p.value for p in points] == pytest.approx(history[key]), key


SCRIPT = """
import os
import mlflow
from mpi4py import MPI

rank = MPI.COMM_WORLD.rank
if rank == 0:
    with mlflow.start_run() as run:  # MLFLOW_RUN_ID: the job's run
        mlflow.log_metric("custom", 1.5, step=3)
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "run_id"), "w") as out:
        out.write(run.info.run_id)
MPI.COMM_WORLD.barrier()
if rank == 1:
    raise ValueError("a bug after logging")
MPI.COMM_WORLD.barrier()
"""


def test_a_script_logs_into_the_job_run_with_mlflow_and_a_failure_ends_it_failed(
    make_script_job, mlflow_server, monkeypatch
):
    env = tracked(mlflow_server)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    root = make_script_job("log.py", {"processes_per_host": 2}, SCRIPT)
    result = run_train(root)
    assert result.returncode == 1, result.stdout[-3000:]
    [run] = runs_of(mlflow_server, env)
    assert (root / "output" / "data" / "run_id").read_text() == run.info.run_id
    assert run.info.status == "FAILED"
    assert run.data.metrics["custom"] == 1.5
    assert "ValueError: a bug after logging" in run.data.tags["failure_reason"]
    assert run.data.tags["exit_code"] == "1"
    assert run.data.tags["mlflow.source.name"] == "log.py"


def test_a_server_that_cannot_be_reached_is_a_warning_not_a_failure(make_job, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    root = make_job({"epochs": 1})
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:]
    warning = (root / "output" / "data" / "WARNING-mlflow.txt").read_text()
    assert warning.startswith("MLflow: http://127.0.0.1:") and "not tracked" in warning
    assert "launcher: WARNING: MLflow" in result.stderr


ARN = "arn:aws:sagemaker:eu-west-1:123456789012:mlflow-tracking-server/team"


def test_a_managed_server_arn_is_signed_for_sagemaker_mlflow(mlflow_server, monkeypatch):
    """AWS's endpoint for the ARN, the ARN in a header, SigV4 for `sagemaker-mlflow`; sent
    (through SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT, as AWS's plugin allows) to the real server."""
    tracking = Tracking.from_environment({"MLFLOW_TRACKING_URI": ARN})
    assert tracking.endpoint == "https://eu-west-1.experiments.sagemaker.aws"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    headers = tracking.request_headers(f"{tracking.endpoint}/api/2.0/mlflow/runs/create", b"{}")
    assert headers["x-mlflow-sm-tracking-server-arn"] == ARN
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDTEST/")
    assert "/eu-west-1/sagemaker-mlflow/aws4_request" in headers["Authorization"]
    signed = Tracking.from_environment(
        {"MLFLOW_TRACKING_URI": ARN, "SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT": mlflow_server}
    )
    assert (
        experiment_id(signed, {"MLFLOW_EXPERIMENT_NAME": "signed"})
        == MlflowClient(mlflow_server).get_experiment_by_name("signed").experiment_id
    )


@pytest.mark.parametrize(
    "uri",
    [
        "arn:aws:sagemaker:eu-west-1:123456789012:notebook-instance/team",
        "arn:aws:sagemaker:eu-west-1:1234:mlflow-tracking-server/team",
    ],
)
def test_a_wrong_arn_fails_every_host_before_training(make_job, monkeypatch, uri):
    with pytest.raises(ConfigError, match="not the ARN of a SageMaker managed MLflow server"):
        Tracking.from_environment({"MLFLOW_TRACKING_URI": uri})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    root = make_job({"epochs": 1})
    result = run_train(root)
    assert result.returncode == 2
    assert "is not the ARN of a SageMaker managed MLflow server" in failure_of(root)


def test_only_a_tracking_server_is_tracked_by_the_launcher():
    assert Tracking.from_environment({}) is None
    assert (
        Tracking.from_environment({"MLFLOW_TRACKING_URI": "file:/opt/ml/output/mlruns"}) is None
    )  # a script's own mlflow writes there; the launcher leaves it alone


def test_a_stopped_job_ends_its_run_killed(make_script_job, mlflow_server, monkeypatch):
    env = tracked(mlflow_server)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    root = make_script_job(
        "wait.py", {}, "import time\nprint('ready', flush=True)\ntime.sleep(120)\n"
    )
    stop_job(root, "ready")
    [run] = runs_of(mlflow_server, env)
    assert run.info.status == "KILLED"
    assert run.data.tags["failure_reason"].startswith("training was stopped by a signal")
