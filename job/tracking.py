"""MLflow tracking over its REST API, for the launcher (one run per job) and the built-in
trainer (each epoch's metrics), with nothing but the standard library (and botocore, in every
image, for a managed server's signature and a token kept in Secrets Manager).

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
`MLFLOW_TRACKING_TOKEN_SECRET_ARN` (ours) names a Secrets Manager secret holding the token,
read with the job's role: a token in the job's Environment is shown by DescribeTrainingJob to
anyone allowed to describe jobs, a secret's ARN is not a secret.

Tracking is optional, so it must never fail, stall or leak the job:
- fail: whatever goes wrong (a refusal, an answer without the expected fields, no credentials)
  is a `TrackingError`, which callers turn into a warning;
- stall: a request has a total deadline (`attempt_seconds`, from connecting to the answer's last
  byte, however slowly a server trickles it) and a call with its retries another
  (`call_seconds`); rank 0 hands its epochs' metrics to a `RunLogger`, whose own thread sends
  them while training goes on, and which waits a bounded time for them at the end;
- leak: redirects are followed only on the same server (scheme, host and port) and only where
  the method stays what it was (a POST answered 301/302/303 would become a GET whose answer
  means nothing): a redirect elsewhere would take the credentials along, so it is refused.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from job.errors import ConfigError

# The pattern botocore's schema gives CreateTrainingJob's MlflowConfig.MlflowResourceArn.
ARN = re.compile(r"arn:(aws[a-z\-]*):sagemaker:([a-z0-9\-]+):[0-9]{12}:mlflow-[a-zA-Z-]*/.+")
SECRET_ARN = re.compile(r"arn:(aws[a-z\-]*):secretsmanager:([a-z0-9\-]+):[0-9]{12}:secret:.+")
SECRET_VARIABLE = "MLFLOW_TRACKING_TOKEN_SECRET_ARN"
SIGNING_SERVICE = "sagemaker-mlflow"
ATTEMPT_SECONDS = 10.0  # one request, connect to last byte
CALL_SECONDS = 30.0  # one call with its retries
TRIES = 3  # a request that met a connection error or a 5xx is tried again, after 1 s then 2 s
REDIRECTS = 3  # on the same server
ANSWER_LIMIT = 1 << 20  # bytes: MLflow's answers to these calls are small
QUEUE_LIMIT = 100  # requests a RunLogger keeps waiting for its sender; then the oldest go
FLUSH_SECONDS = 20.0  # how long the end of training waits for what is still waiting
# MLflow's limits per log-batch request (REST API: runs/log-batch).
BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}
PARAM_VALUE_LIMIT = 6000
WARNING_FILE = "WARNING-mlflow.txt"  # in output/data: every side's tracking warnings


class TrackingError(Exception):
    """A request the server refused or never answered: a warning, never the job's failure."""


class _Refused(Exception):
    """An answer not taken (a redirect that is not followed, an answer too long): not
    retried, said as it is."""


@dataclass(frozen=True)
class Tracking:
    """Where and how to reach the tracking server; `arn` set for a managed MLflow server,
    `token_secret` for a token still to be read from Secrets Manager (`authenticated`)."""

    endpoint: str
    arn: str = ""
    region: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    verify: bool = True
    ca_file: str = ""
    token_secret: str = ""
    attempt_seconds: float = ATTEMPT_SECONDS
    call_seconds: float = CALL_SECONDS

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Tracking | None:
        """The server the job's environment names; None when it names none, or one only a
        user's own `mlflow` can reach (a `file:` or database URI: left to the script). Reads
        nothing: a token in Secrets Manager is read by `authenticated`."""
        uri = environ.get("MLFLOW_TRACKING_URI", "").strip()
        verify = environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() != "true"
        ca_file = environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH", "")
        if uri.startswith("arn:"):
            found = ARN.fullmatch(uri)
            if not found:
                raise ConfigError(
                    f"MLFLOW_TRACKING_URI {uri!r} is not the ARN of a SageMaker managed MLflow "
                    "server (arn:aws:sagemaker:REGION:ACCOUNT:mlflow-tracking-server/NAME); "
                    "copy it from the server's page in SageMaker Studio, or give an "
                    "http(s):// URL"
                )
            region = found.group(2)
            endpoint = (
                environ.get("SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT")
                or f"https://{region}.experiments.sagemaker.aws"
            )
            return cls(
                endpoint.rstrip("/"),
                arn=uri,
                region=region,
                headers={"x-mlflow-sm-tracking-server-arn": uri},
                verify=verify,
                ca_file=ca_file,
            )
        if not uri.startswith(("http://", "https://")):
            return None
        parts = urllib.parse.urlsplit(uri)
        # user:password@ in the URI authenticates as MLflow's client does; the endpoint, which
        # the log shows, keeps neither
        username = urllib.parse.unquote(parts.username or "") or environ.get(
            "MLFLOW_TRACKING_USERNAME", ""
        )
        password = (
            urllib.parse.unquote(parts.password or "")
            if parts.username
            else environ.get("MLFLOW_TRACKING_PASSWORD", "")
        )
        endpoint = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        token = environ.get("MLFLOW_TRACKING_TOKEN", "")
        secret = "" if token else environ.get(SECRET_VARIABLE, "").strip()
        if secret and not SECRET_ARN.fullmatch(secret):
            raise ConfigError(
                f"{SECRET_VARIABLE} {secret!r} is not the ARN of a Secrets Manager secret "
                "(arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-xxxxxx); copy it from the "
                "secret's page in the Secrets Manager console"
            )
        headers = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif username:
            pair = f"{username}:{password}"
            headers["Authorization"] = f"Basic {base64.b64encode(pair.encode()).decode()}"
        return cls(
            endpoint.rstrip("/"),
            headers=headers,
            token_secret=secret,
            verify=verify,
            ca_file=ca_file,
        )

    def authenticated(self, client: Any = None) -> Tracking:
        """This server with its token, read now from Secrets Manager when `token_secret`
        names one (with `client`, else one made with the job's credentials)."""
        return self.with_token(read_token(self.token_secret, client)) if self.token_secret else self

    def with_token(self, token: str) -> Tracking:
        return replace(
            self, headers={**self.headers, "Authorization": f"Bearer {token}"}, token_secret=""
        )

    def plain_http_warning(self) -> str:
        """Why credentials for this server would be readable on the way, or ""."""
        parts = urllib.parse.urlsplit(self.endpoint)
        credentials = "Authorization" in self.headers or self.token_secret
        if parts.scheme != "http" or not credentials or _is_loopback(parts.hostname or ""):
            return ""
        return (
            f"MLflow: credentials go over plain http to {parts.hostname}, readable by "
            "anyone on the way: give the tracking server as https://"
        )

    def call(
        self,
        endpoint: str,
        body: dict[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """POST `body` to (or, without one, GET) /api/2.0/mlflow/`endpoint`; its JSON object.
        A missing resource is {"error_code": "RESOURCE_DOES_NOT_EXIST"}; anything else that
        is not an answer (a refusal, no answer within the deadlines, a redirect elsewhere,
        an answer that is not a JSON object) raises TrackingError."""
        url = f"{self.endpoint}/api/2.0/mlflow/{endpoint}"
        if query:
            url += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        data = None if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + self.call_seconds
        for attempt in range(TRIES):
            last = attempt == TRIES - 1
            try:
                status, text = self._exchange(url, data, deadline)
            except _Refused as refused:
                raise TrackingError(f"{endpoint}: {refused}") from None
            except (OSError, http.client.HTTPException) as error:  # refused, reset, cut, late
                if last or deadline - time.monotonic() < 2**attempt:
                    raise TrackingError(
                        f"{self.endpoint} did not answer {endpoint}: {_said(error)}"
                    ) from None
            else:
                if status < 300:
                    return _answer(endpoint, status, text)
                if status < 500 or last or deadline - time.monotonic() < 2**attempt:
                    return _refusal(endpoint, status, text)
            time.sleep(2**attempt)
        raise AssertionError("unreachable")

    def _exchange(self, url: str, data: bytes | None, deadline: float) -> tuple[int, bytes]:
        """One request and the same-server redirects it meets: (status, body)."""
        method = "GET" if data is None else "POST"
        for _ in range(REDIRECTS + 1):
            status, location, text = self._send(method, url, data, deadline)
            if status not in (301, 302, 303, 307, 308) or not location:
                return status, text
            target = urllib.parse.urljoin(url, location)
            if _origin(target) != _origin(url):
                raise _Refused(
                    f"redirected (HTTP {status}) to another server, "
                    f"{_origin(target)}, which is not sent the credentials: give "
                    "MLFLOW_TRACKING_URI as the server that answers"
                )
            if method == "POST" and status not in (307, 308):
                raise _Refused(
                    f"HTTP {status} to {location} would turn the POST into a GET, "
                    "whose answer logs nothing: give MLFLOW_TRACKING_URI as the "
                    "address the server redirects to"
                )
            url = target
        raise _Refused(f"more than {REDIRECTS} redirects")

    def _send(
        self, method: str, url: str, data: bytes | None, deadline: float
    ) -> tuple[int, str, bytes]:
        """One HTTP exchange, over by `deadline` or by `attempt_seconds`, whichever comes
        first, however the server trickles: a timer shuts the socket then, which ends any
        read. (status, Location, body)."""
        seconds = min(self.attempt_seconds, deadline - time.monotonic())
        if seconds <= 0:
            raise TimeoutError("no time left")
        try:
            headers = self.request_headers(url, data)
        except TrackingError:
            raise
        except Exception as error:  # botocore's own, of any kind: no credentials, bad config
            raise TrackingError(
                f"cannot sign requests to the managed MLflow server {self.arn}: {_said(error)}"
            ) from None
        parts = urllib.parse.urlsplit(url)
        if parts.hostname is None:
            raise TrackingError(f"{url} names no host; MLFLOW_TRACKING_URI takes http(s)://HOST")
        connection = (
            http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=seconds, context=self._tls()
            )
            if parts.scheme == "https"
            else http.client.HTTPConnection(parts.hostname, parts.port, timeout=seconds)
        )
        late = threading.Event()

        def cut() -> None:
            late.set()
            if connection.sock is not None:
                try:
                    connection.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(seconds, cut)
        timer.daemon = True
        timer.start()
        try:
            connection.request(
                method,
                parts.path + (f"?{parts.query}" if parts.query else ""),
                body=data,
                headers=headers,
            )
            answer = connection.getresponse()
            text = answer.read(ANSWER_LIMIT + 1)
            if answer.length:  # read(amount) takes a connection closed early for the end
                raise http.client.IncompleteRead(text, answer.length)
            if len(text) > ANSWER_LIMIT:
                raise _Refused(
                    f"an answer longer than {ANSWER_LIMIT} bytes, which no "
                    "MLflow server gives: is MLFLOW_TRACKING_URI an MLflow server?"
                )
            return answer.status, answer.getheader("Location", ""), text
        except (OSError, http.client.HTTPException):
            if late.is_set():
                raise TimeoutError(f"no whole answer within {seconds:.0f} s") from None
            raise
        finally:
            timer.cancel()
            connection.close()

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
            raise TrackingError(
                f"no AWS credentials to sign requests to the managed MLflow server {self.arn}"
            )
        signed = AWSRequest(
            method="GET" if data is None else "POST", url=url, data=data, headers=headers
        )
        SigV4Auth(credentials, SIGNING_SERVICE, self.region).add_auth(signed)
        return dict(signed.headers.items())

    def _tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file or None)
        if not self.verify:  # the user's MLFLOW_TRACKING_INSECURE_TLS
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context


def read_token(secret_arn: str, client: Any = None) -> str:
    """The MLflow token a Secrets Manager secret holds (its SecretString, trimmed), read with
    the job's credentials (`client` made from them when None: a few seconds at most)."""
    try:
        if client is None:
            import boto3
            from botocore.config import Config

            arn = SECRET_ARN.fullmatch(secret_arn)
            if arn is None:  # from_environment checked it: only a caller's own ARN gets here
                raise ValueError("not the ARN of a Secrets Manager secret")
            client = boto3.client(
                "secretsmanager",
                region_name=arn.group(2),
                config=Config(
                    connect_timeout=5,
                    read_timeout=10,
                    retries={"max_attempts": 2, "mode": "standard"},
                ),
            )
        found = client.get_secret_value(SecretId=secret_arn)
    except Exception as error:  # botocore's, of any kind: the job goes on untracked
        raise TrackingError(
            f"cannot read the MLflow token from {secret_arn}: {_said(error)}; "
            "give the job's role secretsmanager:GetSecretValue on it (and "
            "kms:Decrypt on its key)"
        ) from None
    token = (found.get("SecretString") or "").strip()
    if not token:
        raise TrackingError(
            f"the secret {secret_arn} holds no SecretString: store the MLflow "
            "token as the secret's plain text"
        )
    return token


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {getattr(error, 'reason', None) or error}"


def failure_text(error: BaseException) -> str:
    """What a warning says of a failure of tracking: a TrackingError's own words; any other
    error (a bug of ours, a library's surprise) with its type, so that it can be found."""
    return str(error) if isinstance(error, TrackingError) else _said(error)


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return f"{parts.scheme}://{parts.hostname}:{port}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _answer(endpoint: str, status: int, text: bytes) -> dict[str, Any]:
    """A success's JSON object (an empty body is an empty object)."""
    try:
        answer = json.loads(text or b"{}")
    except ValueError:
        raise TrackingError(
            f"{endpoint} answered HTTP {status} with no JSON: "
            f"{text[:200].decode(errors='replace')!r}"
        ) from None
    if not isinstance(answer, dict):
        raise TrackingError(
            f"{endpoint} answered HTTP {status} with a JSON "
            f"{type(answer).__name__.replace('list', 'array')}, not an object"
        )
    return answer


def _refusal(endpoint: str, status: int, text: bytes) -> dict[str, Any]:
    said = text.decode(errors="replace")
    try:
        answer = json.loads(said)
    except ValueError:
        answer = None
    answer = answer if isinstance(answer, dict) else {}
    if answer.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
        return answer
    raise TrackingError(
        f"{endpoint} refused (HTTP {status}): {answer.get('message') or said[:300]}"
    )


def _field(answer: Mapping[str, Any], endpoint: str, *path: str) -> str:
    """answer[path[0]][path[1]]...: a string, or a TrackingError that says what was missing."""
    value: Any = answer
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
        raise TrackingError(
            f"{endpoint} answered without {'.'.join(path)}: {json.dumps(answer)[:200]}"
        )
    return str(value)


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
            return _field(found, "experiments/get-by-name", "experiment", "experiment_id")
        try:
            return _field(
                tracking.call("experiments/create", {"name": name}),
                "experiments/create",
                "experiment_id",
            )
        except TrackingError:  # made meanwhile by another job: look again
            continue
    raise TrackingError(f"could neither find nor make the experiment {name!r}")


def start_run(tracking: Tracking, experiment: str, name: str) -> str:
    """A new run, RUNNING; its id."""
    body: dict[str, Any] = {"experiment_id": experiment, "start_time": now_ms()}
    if name:
        body["run_name"] = name
    return _field(tracking.call("runs/create", body), "runs/create", "run", "info", "run_id")


def log_batch(
    tracking: Tracking,
    run_id: str,
    *,
    metrics: Sequence[Mapping[str, Any]] = (),
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
) -> None:
    """Log in as many requests as MLflow's per-request limits take; parameter values are cut
    to MLflow's limit (a long JSON hyperparameter still says how it starts)."""
    items: dict[str, list[Mapping[str, Any]]] = {
        "metrics": list(metrics),
        "params": [
            {"key": k, "value": str(v)[:PARAM_VALUE_LIMIT]} for k, v in (params or {}).items()
        ],
        "tags": [{"key": k, "value": str(v)} for k, v in (tags or {}).items()],
    }
    while any(items.values()):
        body: dict[str, Any] = {"run_id": run_id}
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
    """Logs into one run from one process without making it wait: `log` and `end` queue a
    request and return at once; a thread of its own sends them in order, and `close` gives
    it a bounded time to finish. (Rank 0 logging at each epoch's end itself, up to three
    10 s tries, held the other ranks in the next allreduce long enough for the watchdog to
    end a healthy job as hung.)

    Whatever goes wrong is said (`say`) and never raised: the first failure once, after which
    nothing more is sent (a server that went away costs one call's deadline, not one per
    epoch); a server slower than the job, once, as the oldest waiting requests are dropped
    (`limit` wait at most), with the count at `close`; what `close` had to leave unsent."""

    def __init__(
        self, tracking: Tracking, run_id: str, say: Callable[[str], None], limit: int = QUEUE_LIMIT
    ):
        self.tracking, self.run_id, self.say, self.limit = tracking, run_id, say, limit
        self.broken = self.closed = False
        self.dropped = 0
        self._waiting: deque[tuple[Callable[..., None], dict[str, Any]]] = deque()
        self._sending = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._send_all, name="mlflow", daemon=True)
        self._thread.start()

    @classmethod
    def of_environment(
        cls, environ: Mapping[str, str], say: Callable[[str], None]
    ) -> RunLogger | None:
        """The run the launcher made for this job (MLFLOW_RUN_ID), if any."""
        tracking = Tracking.from_environment(environ)
        run_id = environ.get("MLFLOW_RUN_ID", "")
        return cls(tracking, run_id, say) if tracking and run_id else None

    def log(self, **items: Any) -> None:
        """log_batch's metrics, params and tags, sent soon."""
        self._put(log_batch, items)

    def end(self, status: str) -> None:
        """The run's end (end_run), sent after what was logged before."""
        self._put(end_run, {"status": status})

    def close(self, seconds: float = FLUSH_SECONDS) -> None:
        """Wait at most `seconds` for what is queued to be sent; say what was not."""
        with self._changed:
            if self.closed:
                return
            self.closed = True
            self._changed.notify_all()
        self._thread.join(seconds)
        with self._changed:
            unsent = len(self._waiting) + self._sending
        if self.dropped:
            self.say(
                f"MLflow: {self.dropped} request(s) to run {self.run_id} were dropped "
                "while the server was slower than the job"
            )
        if unsent and not self.broken:
            self.say(
                f"MLflow: {unsent} request(s) to run {self.run_id} not sent within the "
                f"{seconds:g} s allowed at the end; the metrics are in the log and in "
                "output/data"
            )

    def _put(self, call: Callable[..., None], items: dict[str, Any]) -> None:
        with self._changed:
            if self.broken or self.closed:
                return
            if len(self._waiting) >= self.limit:
                self._waiting.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    self.say(
                        f"MLflow: the server is slower than the job: dropping the oldest "
                        f"of the requests waiting for run {self.run_id} (at most "
                        f"{self.limit} wait)"
                    )
            self._waiting.append((call, items))
            self._changed.notify_all()

    def _send_all(self) -> None:
        """The sender thread: one request at a time, until closed and nothing waits."""
        while True:
            with self._changed:
                while not self._waiting and not self.closed:
                    self._changed.wait()
                if not self._waiting:
                    return
                call, items = self._waiting.popleft()
                self._sending = True
            try:
                self.tracking = self.tracking.authenticated()  # a token in Secrets Manager
                call(self.tracking, self.run_id, **items)
            except Exception as error:  # any failure of tracking: said, never raised
                with self._changed:
                    self.broken = True
                    self._waiting.clear()
                self.say(
                    f"MLflow: {failure_text(error)}; nothing more is logged to run {self.run_id}"
                )
            finally:
                with self._changed:
                    self._sending = False
