"""job.tracking against a stand-in server on loopback that misbehaves (tests/job/mlflow_stub.py):
every failure is a TrackingError (a warning for the job, never its end), a call has a total
deadline, a redirect never carries the credentials elsewhere nor turns a POST into a GET, the
run logger never makes training wait, and a token kept in Secrets Manager is read with the
request botocore's schema describes (through its Stubber: AWS itself is never reached)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from botocore.stub import Stubber

from job.errors import ConfigError
from job.tracking import (
    SECRET_VARIABLE,
    RunLogger,
    Tracking,
    TrackingError,
    experiment_id,
    log_batch,
    metric,
    read_token,
    start_run,
)
from tests.job.mlflow_stub import cut_short, hang_up, reply, servers, trickle  # noqa: F401
from tests.sagemaker_ops.sagemaker_testing import offline_client
from tests.waiting import eventually

TOKEN = "s3cr3t-token"
RUN = {"run": {"info": {"run_id": "r1"}}}


def tracking_of(url: str, **fields) -> Tracking:
    tracking = Tracking.from_environment(
        {"MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_TOKEN": TOKEN}
    )
    return dataclasses.replace(tracking, **fields)


@pytest.mark.parametrize(
    "answer, says",
    [
        (reply(body={}), "runs/create answered without run.info.run_id"),
        (reply(body={"run": {"info": "x"}}), "runs/create answered without run.info.run_id"),
        (reply(body=[1, 2]), "runs/create answered HTTP 200 with a JSON array, not an object"),
        (reply(raw=b"<html>proxy login</html>"), "runs/create answered HTTP 200 with no JSON"),
        (reply(400, raw=b"[1]"), "runs/create refused (HTTP 400): [1]"),
        (reply(403, raw=b"\xff\xfe garbage"), "runs/create refused (HTTP 403)"),
        (reply(500, body={"message": "db down"}), "runs/create refused (HTTP 500): db down"),
        (hang_up, "did not answer runs/create"),
        (cut_short, "did not answer runs/create"),
    ],
)
def test_every_wrong_answer_is_a_tracking_error(servers, answer, says):
    server = servers(default=answer)
    started = time.monotonic()
    with pytest.raises(
        TrackingError,
        match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]"),
    ):
        start_run(tracking_of(server.url, call_seconds=6), "0", "job")
    assert time.monotonic() - started < 8


def test_a_malformed_experiment_answer_is_a_tracking_error(servers):
    server = servers({"experiments/get-by-name": reply(body={"experiment": {"name": "x"}})})
    with pytest.raises(TrackingError, match="without experiment.experiment_id"):
        experiment_id(tracking_of(server.url), {"MLFLOW_EXPERIMENT_NAME": "x"})


def test_a_trickling_server_costs_a_call_its_deadline_not_a_timeout_per_byte(servers):
    """30 bytes at 1 s each: every read gets a byte in time, so a per-read timeout never
    fires; the call's total deadline does."""
    server = servers(default=trickle(1.0, b'{"run": {"info": {"run_id": 1}}}'))
    tracking = tracking_of(server.url, attempt_seconds=1.5, call_seconds=4)
    started = time.monotonic()
    with pytest.raises(TrackingError, match="did not answer runs/create"):
        start_run(tracking, "0", "job")
    elapsed = time.monotonic() - started
    assert elapsed < 5.5, f"the call took {elapsed:.1f} s past its 4 s deadline"


def test_the_default_deadlines_bound_a_call():
    tracking = Tracking.from_environment({"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert (tracking.attempt_seconds, tracking.call_seconds) == (10.0, 30.0)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_origin_is_refused_and_gets_no_credentials(servers, status):
    elsewhere = servers()
    server = servers(
        default=reply(
            status, raw=b"", headers={"Location": f"{elsewhere.url}/api/2.0/mlflow/runs/create"}
        )
    )
    with pytest.raises(
        TrackingError, match=f"redirected \\(HTTP {status}\\) to another server, {elsewhere.url}"
    ):
        start_run(tracking_of(server.url), "0", "job")
    assert elsewhere.requests == []  # neither the token nor the body went there
    assert [seen.headers["Authorization"] for seen in server.requests] == [f"Bearer {TOKEN}"]


@pytest.mark.parametrize("status", [301, 302, 303])
def test_a_redirect_that_would_turn_a_post_into_a_get_is_refused(servers, status):
    server = servers(
        {"runs/create": reply(status, raw=b"", headers={"Location": "/api/2.0/mlflow/runs/moved"})},
        default=reply(body=RUN),
    )
    with pytest.raises(TrackingError, match=f"HTTP {status}.*would turn the POST into a GET"):
        start_run(tracking_of(server.url), "0", "job")
    assert [seen.path for seen in server.requests] == ["/api/2.0/mlflow/runs/create"]


def test_a_redirect_on_the_same_server_keeps_the_method_the_body_and_the_credentials(servers):
    server = servers(
        {
            "runs/create": reply(
                308, raw=b"", headers={"Location": "/mlflow/api/2.0/mlflow/runs/moved"}
            )
        },
        default=reply(body=RUN),
    )
    assert start_run(tracking_of(server.url), "0", "job") == "r1"
    first, moved = server.requests
    assert (moved.method, moved.path, moved.body) == (
        "POST",
        "/mlflow/api/2.0/mlflow/runs/moved",
        first.body,
    )
    assert moved.headers["Authorization"] == f"Bearer {TOKEN}"


def test_a_managed_server_without_usable_credentials_is_a_tracking_error(
    servers, tmp_path, monkeypatch
):
    """botocore's own error (a credential_process that fails) becomes a TrackingError."""
    server = servers(default=reply(body=RUN))
    config = tmp_path / "config"
    config.write_text("[default]\ncredential_process = false\n")
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    tracking = Tracking.from_environment(
        {
            "MLFLOW_TRACKING_URI": "arn:aws:sagemaker:eu-west-1:123456789012:"
            "mlflow-tracking-server/team",
            "SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT": server.url,
        }
    )
    with pytest.raises(TrackingError, match="cannot sign requests to the managed MLflow server"):
        start_run(tracking, "0", "job")
    assert server.requests == []


class Said:
    """The warnings a RunLogger says, kept for the test."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, text: str) -> None:
        self.lines.append(text)


def test_logging_never_waits_for_a_slow_server_and_the_final_flush_is_bounded(servers):
    """A server that answers each request in 25 s: rank 0's call at each epoch end returns at
    once, and closing waits 2 s, not 25 s per batch, then says what was not sent."""
    slow = servers()
    slow.default = slow.slow(25, reply(body={}))
    said = Said()
    run = RunLogger(tracking_of(slow.url), "r1", said)
    for epoch in range(1, 6):
        started = time.monotonic()
        run.log(metrics=[metric("loss", 1.0 / epoch, epoch)])
        assert time.monotonic() - started < 0.2, "an epoch end waited for the server"
    started = time.monotonic()
    run.close(seconds=2)
    assert 1.8 < time.monotonic() - started < 3
    assert said.lines == [
        "MLflow: 5 request(s) to run r1 not sent within the 2 s allowed at "
        "the end; the metrics are in the log and in output/data"
    ]


def test_a_full_queue_drops_the_oldest_and_says_how_many(servers):
    slow = servers()
    slow.default = slow.slow(25, reply(body={}))
    said = Said()
    run = RunLogger(tracking_of(slow.url), "r1", said, limit=3)
    run.log(metrics=[metric("loss", 1.0, 1)])
    eventually(lambda: slow.requests, "the first batch never reached the server")
    for epoch in range(2, 11):  # 9 more: 3 wait, the 6 oldest are dropped
        run.log(metrics=[metric("loss", 1.0, epoch)])
    run.close(seconds=0.5)
    assert said.lines == [
        "MLflow: the server is slower than the job: dropping the oldest of the requests "
        "waiting for run r1 (at most 3 wait)",
        "MLflow: 6 request(s) to run r1 were dropped while the server was slower than the job",
        "MLflow: 4 request(s) to run r1 not sent within the 0.5 s allowed at the end; the "
        "metrics are in the log and in output/data",
    ]


def test_a_failure_in_the_sender_is_said_once_and_nothing_more_is_sent(servers):
    server = servers(default=reply(400, raw=b"[1]"))
    said = Said()
    run = RunLogger(tracking_of(server.url), "r1", said)
    for epoch in range(1, 4):
        run.log(metrics=[metric("loss", 1.0, epoch)])
    run.end("FINISHED")
    run.close(seconds=10)
    assert said.lines == [
        "MLflow: runs/log-batch refused (HTTP 400): [1]; nothing more is logged to run r1"
    ]
    assert len(server.requests) == 1


def test_a_healthy_server_gets_every_batch_in_order(servers):
    server = servers()
    run = RunLogger(tracking_of(server.url), "r1", Said())
    for epoch in range(1, 4):
        run.log(metrics=[metric("loss", 1.0, epoch)])
    run.end("FINISHED")
    run.close(seconds=10)
    bodies = [json.loads(seen.body) for seen in server.requests]
    assert [body["metrics"][0]["step"] for body in bodies[:3]] == [1, 2, 3]
    assert bodies[3]["status"] == "FINISHED"


SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:mlflow-token-AbCdEf"


def test_a_token_in_secrets_manager_is_read_with_the_job_role():
    """GetSecretValue as botocore's schema has it (the Stubber checks the request and the
    answer against the secretsmanager model); the bearer token then goes to the server."""
    client = offline_client("secretsmanager")
    with Stubber(client) as stub:
        stub.add_response(
            "get_secret_value",
            {"ARN": SECRET, "Name": "mlflow-token", "SecretString": TOKEN + "\n"},
            expected_params={"SecretId": SECRET},
        )
        tracking = Tracking.from_environment(
            {"MLFLOW_TRACKING_URI": "https://mlflow.example", SECRET_VARIABLE: SECRET}
        )
        assert "Authorization" not in tracking.headers
        assert tracking.authenticated(client).headers["Authorization"] == f"Bearer {TOKEN}"
        stub.assert_no_pending_responses()


def test_a_secret_that_cannot_be_read_is_a_tracking_error():
    client = offline_client("secretsmanager")
    with Stubber(client) as stub:
        stub.add_client_error(
            "get_secret_value",
            "AccessDeniedException",
            "not authorized to perform secretsmanager:GetSecretValue",
            expected_params={"SecretId": SECRET},
        )
        with pytest.raises(
            TrackingError,
            match=f"cannot read the MLflow token from {SECRET}: "
            ".*AccessDeniedException.*give the job's role "
            "secretsmanager:GetSecretValue",
        ):
            read_token(SECRET, client)


def test_a_binary_secret_is_a_tracking_error():
    client = offline_client("secretsmanager")
    with Stubber(client) as stub:
        stub.add_response(
            "get_secret_value", {"SecretBinary": b"\x00"}, expected_params={"SecretId": SECRET}
        )
        with pytest.raises(TrackingError, match="holds no SecretString"):
            read_token(SECRET, client)


def test_a_token_given_outright_wins_over_the_secret():
    tracking = Tracking.from_environment(
        {
            "MLFLOW_TRACKING_URI": "https://mlflow.example",
            "MLFLOW_TRACKING_TOKEN": TOKEN,
            SECRET_VARIABLE: SECRET,
        }
    )
    assert tracking.token_secret == ""
    assert tracking.authenticated().headers["Authorization"] == f"Bearer {TOKEN}"


def test_a_secret_arn_of_something_else_is_a_configuration_error():
    with pytest.raises(
        ConfigError, match=f"{SECRET_VARIABLE} .* is not the ARN of a Secrets Manager secret"
    ):
        Tracking.from_environment(
            {"MLFLOW_TRACKING_URI": "https://mlflow.example", SECRET_VARIABLE: "mlflow-token"}
        )


@pytest.mark.parametrize(
    "uri, environ, warned",
    [
        ("http://mlflow.example:5000", {"MLFLOW_TRACKING_TOKEN": TOKEN}, True),
        ("http://mlflow.example:5000", {SECRET_VARIABLE: SECRET}, True),
        ("http://10.0.0.5", {"MLFLOW_TRACKING_USERNAME": "me"}, True),
        ("http://mlflow.example:5000", {}, False),
        ("https://mlflow.example", {"MLFLOW_TRACKING_TOKEN": TOKEN}, False),
        ("http://127.0.0.1:5000", {"MLFLOW_TRACKING_TOKEN": TOKEN}, False),
        ("http://localhost:5000", {"MLFLOW_TRACKING_TOKEN": TOKEN}, False),
    ],
)
def test_credentials_over_plain_http_to_another_host_are_warned_of(uri, environ, warned):
    tracking = Tracking.from_environment({"MLFLOW_TRACKING_URI": uri, **environ})
    warning = tracking.plain_http_warning()
    assert bool(warning) == warned
    if warned:
        assert warning.startswith("MLflow: credentials go over plain http to ")
        assert TOKEN not in warning


def test_credentials_in_the_uri_become_basic_authentication_and_leave_the_endpoint(servers):
    server = servers()
    port = server.url.rsplit(":", 1)[1]
    tracking = Tracking.from_environment(
        {"MLFLOW_TRACKING_URI": f"http://me:pa%40ss@127.0.0.1:{port}"}
    )
    assert tracking.endpoint == server.url  # what the log shows
    log_batch(tracking, "r1", tags={"a": "b"})
    assert server.requests[0].headers["Authorization"] == "Basic bWU6cGFAc3M="  # me:pa@ss
