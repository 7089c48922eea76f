"""MLflow tracking over its REST API, for the launcher (one run per job) and the built-in
trainer (each epoch's metrics), with nothing but the standard library.

Why not the `mlflow` package: the built-in trainer logs a handful of calls per epoch, and the
package (or `mlflow-skinny`, ~90 MB with its dependencies) would grow every image for them; a
SageMaker managed MLflow server would also need AWS's `sagemaker-mlflow` plugin, which pulls in
the whole of `mlflow` (~650 MB). A user's script that wants the package installs it
(requirements.txt) and finds the job's run through the variables MLflow itself reads
(`MLFLOW_TRACKING_URI`, `MLFLOW_RUN_ID`, `MLFLOW_EXPERIMENT_ID`), which every rank gets.

The server is named by MLflow's own variables: `MLFLOW_TRACKING_URI` is an HTTP(S) URL, or the
ARN of a SageMaker managed MLflow server (then the endpoint and signing are what AWS's plugin
does: `https://<region>.experiments.sagemaker.aws`, the ARN in a header, SigV4 for the service
`sagemaker-mlflow` with the job's credentials, `SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT` overriding the
endpoint); `MLFLOW_TRACKING_TOKEN` or `MLFLOW_TRACKING_USERNAME`/`_PASSWORD` authenticate,
`MLFLOW_TRACKING_SERVER_CERT_PATH` and `MLFLOW_TRACKING_INSECURE_TLS` decide TLS;
`MLFLOW_EXPERIMENT_NAME` (made when missing) or `MLFLOW_EXPERIMENT_ID` the experiment;
`MLFLOW_RUN_NAME` the run's name (else the job's). Without a URI nothing is sent.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from job.errors import ConfigError

# The pattern botocore's schema gives CreateTrainingJob's MlflowConfig.MlflowResourceArn.
ARN = re.compile(r"arn:(aws[a-z\-]*):sagemaker:([a-z0-9\-]+):[0-9]{12}:mlflow-[a-zA-Z-]*/.+")
SIGNING_SERVICE = "sagemaker-mlflow"
TIMEOUT = 10.0  # seconds per request: a slow server costs a job at most this, then a warning
TRIES = 3  # a request that met a connection error or a 5xx is tried again, after 1 s then 2 s
# MLflow's limits per log-batch request (REST API: runs/log-batch).
BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}
PARAM_VALUE_LIMIT = 6000
# The variables that tell a job's processes which run they log into (MLflow's own names).
RUN_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")


class TrackingError(Exception):
    """A request the server refused or never answered: a warning, never the job's failure."""


@dataclass(frozen=True)
class Tracking:
    """Where and how to reach the tracking server; `arn` set for a managed MLflow server."""

    endpoint: str
    arn: str = ""
    region: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    verify: bool = True
    ca_file: str = ""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Tracking | None:
        """The server the job's environment names; None when it names none, or one only a
        user's own `mlflow` can reach (a `file:` or database URI: left to the script)."""
        uri = environ.get("MLFLOW_TRACKING_URI", "").strip()
        tls = {"verify": environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() != "true",
               "ca_file": environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH", "")}
        if uri.startswith("arn:"):
            found = ARN.fullmatch(uri)
            if not found:
                raise ConfigError(
                    f"MLFLOW_TRACKING_URI {uri!r} is not the ARN of a SageMaker managed MLflow "
                    "server (arn:aws:sagemaker:REGION:ACCOUNT:mlflow-tracking-server/NAME); "
                    "copy it from the server's page in SageMaker Studio, or give an "
                    "http(s):// URL")
            region = found.group(2)
            endpoint = environ.get("SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT") or \
                f"https://{region}.experiments.sagemaker.aws"
            return cls(endpoint.rstrip("/"), arn=uri, region=region,
                       headers={"x-mlflow-sm-tracking-server-arn": uri}, **tls)
        if not uri.startswith(("http://", "https://")):
            return None
        headers = {}
        if environ.get("MLFLOW_TRACKING_TOKEN"):
            headers["Authorization"] = f"Bearer {environ['MLFLOW_TRACKING_TOKEN']}"
        elif environ.get("MLFLOW_TRACKING_USERNAME"):
            pair = f"{environ['MLFLOW_TRACKING_USERNAME']}:" \
                   f"{environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
            headers["Authorization"] = f"Basic {base64.b64encode(pair.encode()).decode()}"
        return cls(uri.rstrip("/"), headers=headers, **tls)

    def call(self, endpoint: str, body: dict[str, Any] | None = None,
             query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """POST `body` to (or, without one, GET) /api/2.0/mlflow/`endpoint`; its JSON answer.
        A missing resource is {"error_code": "RESOURCE_DOES_NOT_EXIST"}; other refusals and
        a server that stays unreachable raise TrackingError."""
        url = f"{self.endpoint}/api/2.0/mlflow/{endpoint}"
        if query:
            url += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        data = None if body is None else json.dumps(body).encode()
        attempt = 0
        while True:
            request = urllib.request.Request(url, data=data,
                                             method="GET" if data is None else "POST",
                                             headers=self.request_headers(url, data))
            last = attempt == TRIES - 1
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT,
                                            context=self._tls()) as answer:
                    return json.loads(answer.read() or b"{}")
            except urllib.error.HTTPError as error:
                text = error.read().decode(errors="replace")
                if error.code < 500 or last:
                    return _refusal(endpoint, error.code, text)
            except (OSError, ValueError) as error:  # refused, reset, timed out, not JSON
                if last:
                    raise TrackingError(f"{self.endpoint} did not answer {endpoint}: "
                                        f"{getattr(error, 'reason', None) or error}") from None
            time.sleep(2 ** attempt)
            attempt += 1

    def request_headers(self, url: str, data: bytes | None) -> dict[str, str]:
        """The headers of a request: JSON, the user's authentication, and for a managed
        server its ARN and a signature."""
        headers = {"Content-Type": "application/json", **self.headers}
        if not self.arn:
            return headers
        # SigV4 as AWS's sagemaker-mlflow plugin signs (sagemaker_mlflow/auth.py); botocore is
        # in every image (sagemaker-training's boto3) and imported only for a managed server.
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.session import get_session

        credentials = get_session().get_credentials()
        if credentials is None:
            raise TrackingError("no AWS credentials to sign requests to the managed MLflow "
                                f"server {self.arn}")
        signed = AWSRequest(method="GET" if data is None else "POST", url=url, data=data,
                            headers=headers)
        SigV4Auth(credentials, SIGNING_SERVICE, self.region).add_auth(signed)
        return dict(signed.headers.items())

    def _tls(self) -> ssl.SSLContext | None:
        if not self.endpoint.startswith("https://"):
            return None
        context = ssl.create_default_context(cafile=self.ca_file or None)
        if not self.verify:  # the user's MLFLOW_TRACKING_INSECURE_TLS
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context


def _refusal(endpoint: str, status: int, text: str) -> dict[str, Any]:
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {}
    if answer.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
        return answer
    raise TrackingError(f"{endpoint} refused (HTTP {status}): "
                        f"{answer.get('message') or text[:300]}")


def experiment_id(tracking: Tracking, environ: Mapping[str, str]) -> str:
    """The experiment the job's run goes in: MLFLOW_EXPERIMENT_ID, else MLFLOW_EXPERIMENT_NAME
    (made when missing; two jobs making it at once both end in it), else MLflow's default."""
    if environ.get("MLFLOW_EXPERIMENT_ID"):
        return environ["MLFLOW_EXPERIMENT_ID"]
    name = environ.get("MLFLOW_EXPERIMENT_NAME", "")
    if not name:
        return "0"
    for _ in range(2):
        found = tracking.call("experiments/get-by-name", query={"experiment_name": name})
        if "experiment" in found:
            return found["experiment"]["experiment_id"]
        try:
            return tracking.call("experiments/create", {"name": name})["experiment_id"]
        except TrackingError:  # made meanwhile by another job: look again
            continue
    raise TrackingError(f"could neither find nor make the experiment {name!r}")


def start_run(tracking: Tracking, experiment: str, name: str) -> str:
    """A new run, RUNNING; its id."""
    body: dict[str, Any] = {"experiment_id": experiment, "start_time": now_ms()}
    if name:
        body["run_name"] = name
    return tracking.call("runs/create", body)["run"]["info"]["run_id"]


def log_batch(tracking: Tracking, run_id: str, *, metrics: list[dict[str, Any]] = (),
              params: Mapping[str, Any] | None = None,
              tags: Mapping[str, Any] | None = None) -> None:
    """Log in as many requests as MLflow's per-request limits take; parameter values are cut
    to MLflow's limit (a long JSON hyperparameter still says how it starts)."""
    items = {"metrics": list(metrics),
             "params": [{"key": k, "value": str(v)[:PARAM_VALUE_LIMIT]}
                        for k, v in (params or {}).items()],
             "tags": [{"key": k, "value": str(v)} for k, v in (tags or {}).items()]}
    while any(items.values()):
        body = {"run_id": run_id}
        for kind, limit in BATCH_LIMITS.items():
            body[kind], items[kind] = items[kind][:limit], items[kind][limit:]
        tracking.call("runs/log-batch", body)


def end_run(tracking: Tracking, run_id: str, status: str) -> None:
    """FINISHED, FAILED or KILLED, now."""
    tracking.call("runs/update", {"run_id": run_id, "status": status, "end_time": now_ms()})


def metric(key: str, value: float, step: int) -> dict[str, Any]:
    return {"key": key, "value": float(value), "timestamp": now_ms(), "step": step}


def now_ms() -> int:
    return int(time.time() * 1000)


class RunLogger:
    """Logs into one run from one process. The job goes on when the server fails it: the
    first failure is said once (`say`), and nothing more is sent, so a server that went away
    costs the job one request's timeouts, not one per epoch."""

    def __init__(self, tracking: Tracking, run_id: str, say: Callable[[str], None]):
        self.tracking, self.run_id, self.say = tracking, run_id, say
        self.broken = False

    @classmethod
    def of_environment(cls, environ: Mapping[str, str],
                       say: Callable[[str], None]) -> RunLogger | None:
        """The run the launcher made for this job (MLFLOW_RUN_ID), if any."""
        tracking = Tracking.from_environment(environ)
        run_id = environ.get("MLFLOW_RUN_ID", "")
        return cls(tracking, run_id, say) if tracking and run_id else None

    def log(self, **items) -> None:
        """log_batch's metrics, params and tags."""
        if not self.broken:
            self._guarded(log_batch, **items)

    def end(self, status: str) -> None:
        if not self.broken:
            self._guarded(end_run, status)

    def _guarded(self, call: Callable[..., None], *args, **kwargs) -> None:
        try:
            call(self.tracking, self.run_id, *args, **kwargs)
        except TrackingError as error:
            self.broken = True
            self.say(f"WARNING: MLflow: {error}; nothing more is logged to run {self.run_id}")
