"""Whole jobs (the real `train` launcher and trainer) against a stand-in MLflow server on
loopback that misbehaves (tests/job/mlflow_stub.py): tracking never fails a job, and a token
kept in Secrets Manager (a stand-in on loopback, reached through botocore's
AWS_ENDPOINT_URL_SECRETS_MANAGER) reaches the launcher and rank 0 but no log."""

from __future__ import annotations

import json

from container.mpirun import Command, Option, render
from tests.conftest import run_train
from tests.job.mlflow_stub import reply, servers  # noqa: F401

TOKEN = "tok-9f8e7d"
SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:mlflow-token-AbCdEf"
RUN = {"run": {"info": {"run_id": "r1"}}}


def with_secret_token(monkeypatch, tracking_uri: str, secrets_manager: str) -> None:
    """The job's environment: the server, the token's secret, and botocore sent to the
    stand-in Secrets Manager with made-up credentials."""
    for name, value in {
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_TRACKING_TOKEN_SECRET_ARN": SECRET,
        "AWS_ENDPOINT_URL_SECRETS_MANAGER": secrets_manager,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }.items():
        monkeypatch.setenv(name, value)


def refuse_metrics(handler) -> None:
    """runs/log-batch: the launcher's parameters are taken, rank 0's metrics refused with a
    body that is JSON but not an object (which once crashed rank 0 at its first epoch end)."""
    body = json.loads(handler.seen.body)
    (reply(400, raw=b"[1]") if body.get("metrics") else reply(body={}))(handler)


def test_a_server_failing_rank_0_mid_job_is_a_warning_and_the_secret_token_stays_unlogged(
    servers, make_job, monkeypatch
):
    mlflow = servers(
        {
            "experiments/get-by-name": reply(body={"experiment": {"experiment_id": "7"}}),
            "runs/create": reply(body=RUN),
            "runs/log-batch": refuse_metrics,
        }
    )
    secrets = servers(
        default=reply(body={"ARN": SECRET, "Name": "mlflow-token", "SecretString": TOKEN})
    )
    with_secret_token(monkeypatch, mlflow.url, secrets.url)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "digits")
    root = make_job({"epochs": 2})
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [asked] = secrets.requests
    assert asked.headers["X-Amz-Target"] == "secretsmanager.GetSecretValue"
    assert json.loads(asked.body) == {"SecretId": SECRET}
    calls = [
        (seen.path.split("/mlflow/")[1].split("?")[0], json.loads(seen.body or b"{}"))
        for seen in mlflow.requests
    ]
    assert {seen.headers["Authorization"] for seen in mlflow.requests} == {f"Bearer {TOKEN}"}
    metrics = [body for path, body in calls if body.get("metrics")]
    assert len(metrics) == 1  # rank 0 had the token; refused, it sent nothing more
    assert calls[-1] == ("runs/update", {**calls[-1][1], "status": "FINISHED"})
    warning = (root / "output" / "data" / "WARNING-mlflow.txt").read_text()
    assert (
        warning == "MLflow: runs/log-batch refused (HTTP 400): [1]; nothing more is logged "
        "to run r1\n"
    )
    assert "trainer: WARNING: MLflow: runs/log-batch refused" in result.stdout + result.stderr
    assert TOKEN not in result.stdout + result.stderr  # not in the mpirun command, nor a log


def test_a_malformed_answer_at_the_start_is_a_warning_and_the_job_untracked(
    servers, make_job, monkeypatch
):
    """runs/create answers 200 without the run: the launcher once exited 1 on its KeyError."""
    mlflow = servers({"runs/create": reply(body={"run": {}})})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow.url)
    root = make_job({"epochs": 1})
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    warning = (root / "output" / "data" / "WARNING-mlflow.txt").read_text()
    assert (
        warning == 'MLflow: runs/create answered without run.info.run_id: {"run": {}}; '
        "this job is not tracked (its metrics are in the log and in output/data)\n"
    )
    assert [seen.path for seen in mlflow.requests] == ["/api/2.0/mlflow/runs/create"]


def test_a_token_that_cannot_be_read_is_a_warning_and_the_job_untracked(
    servers, make_job, monkeypatch
):
    mlflow = servers()
    secrets = servers(
        default=reply(400, body={"__type": "AccessDeniedException", "message": "not authorized"})
    )
    with_secret_token(monkeypatch, mlflow.url, secrets.url)
    root = make_job({"epochs": 1})
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    warning = (root / "output" / "data" / "WARNING-mlflow.txt").read_text()
    assert warning.startswith(
        f"MLflow: cannot read the MLflow token from {SECRET}: "
        "ClientError: An error occurred (AccessDeniedException)"
    )
    assert "this job is not tracked" in warning
    assert mlflow.requests == []


def test_the_token_reaches_the_ranks_by_name_never_in_the_command_line():
    command = Command(
        hosts=("algo-1",),
        processes_per_host=2,
        interface="eth0",
        instance_type="ml.c5.xlarge",
        ssh_args=None,
        environment={},
        program=("python", "-m", "train"),
        user_options=(Option(("--display-map",)),),
    )
    started = command.started({"MLFLOW_RUN_ID": "r1"}, secrets=("MLFLOW_TRACKING_TOKEN",))
    assert render(started) == (
        "mpirun",
        "-x",
        "MLFLOW_RUN_ID=r1",
        "-x",
        "MLFLOW_TRACKING_TOKEN",
        *render(command)[1:],
    )
    assert started.rank_variable("MLFLOW_RUN_ID") == "r1"
    assert started.rank_variable("MLFLOW_TRACKING_TOKEN") is None  # mpirun's own value
