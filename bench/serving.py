"""Benchmark and soak run of the inference server (`make bench-serve`, `make soak-serve`).

The benchmark compares `serve`, with its defaults, against a carefully written
bring-your-own-container server on the same machine and model: Flask on gunicorn sync
workers, one per core, the SavedModel loaded once per worker, one call of a traced
`tf.function` per request, CSV in, JSON out (`baseline_app` below). `wrk` drives both with
keep-alive connections, one CSV row per request, at concurrency 1, 8, 32 and 64, on the
digits MLP and on a CNN (conv_filters 384,384,768) whose one-row call costs more than a
millisecond. Each cell's runs alternate between the two servers in mirrored order (A B, B A,
A B, B A), so that the load of other processes, and this shared machine's speed drifting during
a cell (at c=1 it changed 2x within a minute), fall on both alike; each figure is the median
of `--repeats` runs. It prints requests/s, p50/p99, the CPU time each server spends per
request, the ratios serve/baseline, and the targets.

The soak run (`--soak`) sends `serve` a few minutes of mixed traffic at concurrency 64: valid
CSV and JSON requests, whose answers are checked against the model run in this process, and
invalid ones (bad numbers, shapes, charsets, .npy headers, types, paths, oversized bodies),
whose statuses are checked, plus a few clients that send their bodies a byte at a time. It
first posts 64 concurrent 6 MB CSV bodies at once. It prints the statuses, any wrong answer,
and the workers' resident memory over time; it fails unless there is no 5xx, every answer is
right and memory after warm-up stays within 10 %.

    python -m bench.serving [--duration 4] [--repeats 4] [--models mlp,cnn]
    python -m bench.serving --soak [--soak-minutes 3]

Models are trained once under build/bench-serve/<name> by scripts/default_job.py; the servers'
logs are build/bench-serve/serve.log and baseline.log. `wrk` is
installed from Debian when missing (as root; otherwise the apt-get line is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from bench.results import Measurement, Target, markdown_table, text_table, write_report
from bench.results import report as results_report
from container.network import free_port
from job.metadata import SAVEDMODEL_PATH

if TYPE_CHECKING:  # imported where used: the baseline server's worker, never the bench
    import flask

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "bench-serve"
RESULTS = ROOT / "results"
CONCURRENCIES = (1, 8, 32, 64)
MODELS = {"mlp": [], "cnn": ["--model", "cnn", "--set", "conv_filters=384,384,768"]}
SERVE, BASELINE = "serve", "baseline"


# --- set-up --------------------------------------------------------------------------------


def ensure_wrk() -> str:
    """The path of `wrk`, installing the Debian package when it is missing and we are root."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() != 0:
        sys.exit(
            "bench-serve: wrk is missing; install it with: "
            "sudo apt-get install -y --no-install-recommends wrk"
        )
    print("bench-serve: installing the Debian package wrk", flush=True)
    subprocess.run(["apt-get", "update", "-q"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "wrk"],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    installed = shutil.which("wrk")
    if installed is None:
        raise RuntimeError("apt-get installed the Debian package wrk, but no wrk is on PATH")
    return installed


def ensure_model(name: str) -> Path:
    """The ML root of model `name`, trained there by the default job when missing or when
    it was trained with other arguments than MODELS[name] (build/bench-serve/<name>/args.json)."""
    ml_root = BUILD / name
    arguments = ["--epochs", "1", *MODELS[name]]
    stamp = ml_root / "args.json"
    trained = (
        (ml_root / "model" / "metadata.json").exists()
        and stamp.exists()
        and json.loads(stamp.read_text()) == arguments
    )
    if not trained:
        print(f"bench-serve: training the {name} model under {ml_root}", flush=True)
        shutil.rmtree(ml_root, ignore_errors=True)
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "default_job.py"),
                "--ml-root",
                str(ml_root),
                *arguments,
            ],
            check=True,
        )
        stamp.write_text(json.dumps(arguments))
    return ml_root


def digits() -> npt.NDArray[Any]:
    from sklearn.datasets import load_digits

    data: npt.NDArray[Any] = load_digits().data  # 1797 rows of 64 pixel values
    return data


def csv_row(row: npt.NDArray[Any]) -> bytes:
    return ",".join(f"{value:g}" for value in row).encode()


# --- the baseline: a carefully written BYOC server -------------------------------------------


def baseline_app(ml_root: Path) -> flask.Flask:
    """Loads the SavedModel once (in the worker, after fork), traces one call, serves CSV."""
    import flask
    import tensorflow as tf

    metadata = json.loads((ml_root / "model" / "metadata.json").read_text())
    shape = tuple(metadata["input_shape"])
    model = tf.keras.models.load_model(
        str(ml_root / "model" / metadata["model_path"]), compile=False
    )
    forward = tf.function(
        lambda batch: model(batch, training=False),
        input_signature=[tf.TensorSpec((None, *shape), tf.float32)],
    )
    forward(np.zeros((1, *shape), np.float32))
    app = flask.Flask("baseline")

    @app.get("/ping")
    def ping() -> flask.Response:
        return flask.Response(status=200)

    @app.post("/invocations")
    def invocations() -> flask.Response:
        if flask.request.mimetype != "text/csv":
            return flask.Response("this predictor reads text/csv", status=415)
        rows = np.loadtxt(
            io.BytesIO(flask.request.get_data()), delimiter=",", ndmin=2, dtype=np.float32
        )
        probabilities = forward(rows.reshape((-1, *shape))).numpy()
        return flask.jsonify(
            predictions=[
                {"class": metadata["classes"][int(row.argmax())], "probabilities": row.tolist()}
                for row in probabilities
            ]
        )

    return app


def run_baseline_server(port: int, ml_root: Path) -> None:
    from gunicorn.app.base import BaseApplication

    class Baseline(BaseApplication):
        def load_config(self) -> None:
            for name, value in {
                "bind": [f"127.0.0.1:{port}"],
                "workers": os.cpu_count(),
                "worker_class": "sync",
                "timeout": 60,
                "accesslog": None,
                "control_socket_disable": True,
                "loglevel": "warning",
            }.items():
                self.cfg.set(name, value)

        def load(self) -> flask.Flask:
            return baseline_app(ml_root)

    Baseline().run()


# --- servers ---------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]

    def pids(self) -> list[int]:
        """The master and its workers (the process group of the session)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.process.pid:
                        found.append(int(entry.name))
                except OSError:
                    pass
        return found

    def cpu_s(self) -> float:
        """CPU time used so far by the server's processes."""
        total = 0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")

    def worker_rss_mb(self) -> dict[int, float]:
        """Resident memory of each worker (every process but the master), in MB."""
        sizes = {}
        for pid in self.pids():
            if pid == self.process.pid:
                continue
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            kb = re.search(r"VmRSS:\s+(\d+)", status)
            if kb:
                sizes[pid] = int(kb.group(1)) / 1024
        return sizes


def wait_until_healthy(port: int, process: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(
        f"the server on port {port} did not answer /ping with 200 in {timeout_s:.0f} s"
    )


@contextmanager
def started(name: str, ml_root: Path, env: dict[str, str] | None = None) -> Iterator[Server]:
    port = free_port()
    if name == SERVE:
        command = [str(Path(sys.executable).parent / "serve"), "--ml-root", str(ml_root)]
    else:
        command = [
            sys.executable,
            "-m",
            "bench.serving",
            "--baseline-server",
            str(port),
            "--ml-root",
            str(ml_root),
        ]
    log = BUILD / f"{name}.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            cwd=ROOT,
            env={**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port), **(env or {})},
        )
    try:
        wait_until_healthy(port, process)
        yield Server(name, port, process)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


# --- wrk -------------------------------------------------------------------------------------


@dataclass
class Result:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_request: float
    non_2xx: int


UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _requests_per_s(output: str) -> float:
    found = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if found is None:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{output}")
    return float(found.group(1))


def _percentile_ms(output: str, percent: int) -> float:
    found = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s|m)\s*$", output, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no {percent}% latency in wrk's output:\n{output}")
    return float(found.group(1)) * UNITS_MS[found.group(2)]


def wrk(wrk_path: str, server: Server, script: Path, concurrency: int, duration_s: float) -> Result:
    """One wrk run against `server`: requests/s, p50/p99 and the server's CPU per request."""
    cpu_before = server.cpu_s()
    output = subprocess.run(
        [
            wrk_path,
            "-t1",
            f"-c{concurrency}",
            f"-d{duration_s:g}s",
            "--latency",
            "-s",
            str(script),
            f"http://127.0.0.1:{server.port}/invocations",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cpu_s = server.cpu_s() - cpu_before
    rate = _requests_per_s(output)
    p50, p99 = _percentile_ms(output, 50), _percentile_ms(output, 99)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors = re.search(r"Socket errors:.*", output)
    if errors:
        print(f"    wrk: {errors.group(0)}", flush=True)
    return Result(
        rate,
        p50,
        p99,
        1000 * cpu_s / max(1.0, rate * duration_s),
        int(non_2xx.group(1)) if non_2xx else 0,
    )


def wrk_script(directory: Path, row: npt.NDArray[Any]) -> Path:
    script = directory / "post_csv_row.lua"
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = "{csv_row(row).decode()}"\n'
        'wrk.headers["Content-Type"] = "text/csv"\n'
        'wrk.headers["Accept"] = "application/json"\n'
    )
    return script


# --- the benchmark ---------------------------------------------------------------------------


def forward_cost_ms(ml_root: Path, rows: npt.NDArray[Any]) -> dict[int, float]:
    """The model alone: ms per traced call of 1 and 32 rows, in this process, one thread."""
    code = f"""
import json, time, numpy as np, tensorflow as tf
model = tf.keras.models.load_model({str(ml_root / "model" / SAVEDMODEL_PATH)!r}, compile=False)
rows = np.array({rows[:32].tolist()}, np.float32)
forward = tf.function(lambda b: model(b, training=False),
                      input_signature=[tf.TensorSpec((None, rows.shape[1]), tf.float32)])
costs = {{}}
for n in (1, 32):
    batch = tf.constant(rows[:n]); forward(batch)
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < 1.0:
        forward(batch).numpy(); calls += 1
    costs[n] = 1000 * (time.perf_counter() - start) / calls
print(json.dumps(costs))
"""
    env = {
        **os.environ,
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    return {int(n): cost for n, cost in json.loads(output.splitlines()[-1]).items()}


HEADER = (
    f"{'model':<5} {'conc':>4} {'server':<9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
    f"{'cpu ms/req':>10} {'non-2xx':>7} {'load':>5}"
)


def bench_model(
    name: str, wrk_path: str, args: argparse.Namespace, workdir: Path
) -> dict[int, dict[str, Result]]:
    ml_root = ensure_model(name)
    rows = digits()
    costs = forward_cost_ms(ml_root, rows)
    print(
        f"\n{name}: the traced forward pass alone, one thread: {costs[1]:.2f} ms for 1 row, "
        f"{costs[32]:.2f} ms for 32 rows",
        flush=True,
    )
    script = wrk_script(workdir, rows[0])
    table: dict[int, dict[str, Result]] = {}
    with started(SERVE, ml_root) as serve, started(BASELINE, ml_root) as baseline:
        servers = (serve, baseline)
        for server in servers:  # every worker loaded and warm before measuring
            wrk(wrk_path, server, script, 8, 2)
        print(HEADER, flush=True)
        for concurrency in CONCURRENCIES:
            runs: dict[str, list[Result]] = {SERVE: [], BASELINE: []}
            for repeat in range(args.repeats):  # A B, B A, ...: see the module docstring
                for server in servers if repeat % 2 == 0 else servers[::-1]:
                    runs[server.name].append(
                        wrk(wrk_path, server, script, concurrency, args.duration)
                    )
            table[concurrency] = {}
            for server in servers:
                results = runs[server.name]
                median = Result(
                    *(
                        statistics.median(getattr(r, field) for r in results)
                        for field in Result.__dataclass_fields__
                    )
                )
                table[concurrency][server.name] = median
                print(
                    f"{name:<5} {concurrency:>4} {server.name:<9} "
                    f"{median.requests_per_s:>8.0f} {median.p50_ms:>8.2f} "
                    f"{median.p99_ms:>8.2f} {median.cpu_ms_per_request:>10.2f} "
                    f"{sum(r.non_2xx for r in results):>7} {os.getloadavg()[0]:>5.1f}",
                    flush=True,
                )
    return table


# serve/baseline requests/s at least this; p99 at most this times the baseline's. The MLP's
# p99 may rise to 1.5x: its requests are almost all Python, and on gunicorn's stock threaded
# worker a worker's request threads share the interpreter lock in no particular order and the
# kernel spreads connections by hash, not by load (docs/performance.md).
THROUGHPUT_TARGETS = {"cnn": {1: 1.0, 8: 1.0, 32: 2.0}, "mlp": {1: 1.0, 8: 1.0}}
P99_TARGETS = {"cnn": 1.0, "mlp": 1.5}
ITEM = 8  # the serving rows' number in the shared benchmark table (bench.results)
REFERENCE = "careful BYOC server"


def measurements(tables: dict[str, dict[int, dict[str, Result]]]) -> list[Measurement]:
    """The benchmark's rows in the shared table: requests/s and p99 against the baseline."""
    rows = []
    for name, table in tables.items():
        for concurrency, cell in table.items():
            serve, baseline = cell[SERVE], cell[BASELINE]
            throughput = THROUGHPUT_TARGETS[name].get(concurrency)
            rows.append(
                Measurement(
                    ITEM,
                    f"serve {name} c={concurrency} throughput",
                    "req/s",
                    serve.requests_per_s,
                    baseline.requests_per_s,
                    REFERENCE,
                    Target("ratio", ">=", throughput) if throughput else None,
                )
            )
            rows.append(
                Measurement(
                    ITEM,
                    f"serve {name} c={concurrency} p99",
                    "ms",
                    serve.p99_ms,
                    baseline.p99_ms,
                    REFERENCE,
                    Target("ratio", "<=", P99_TARGETS[name]),
                )
            )
            rows.append(
                Measurement(
                    ITEM,
                    f"serve {name} c={concurrency} non-2xx answers",
                    "",
                    serve.non_2xx,
                    target=Target("value", "<=", 0),
                )
            )
    return rows


def report(tables: dict[str, dict[int, dict[str, Result]]], started_at: float) -> bool:
    rows = measurements(tables)
    print("\n" + text_table(rows))
    path = write_report(
        results_report(rows, tiny=False, started=started_at), RESULTS, name="bench-serve"
    )
    (RESULTS / "bench-serve-latest.md").write_text(markdown_table(rows) + "\n")
    all_met = all(row.met is not False for row in rows)
    print(f"\ntargets: {'all met' if all_met else 'MISSED'}; results in {path}")
    return all_met


# --- the soak run ----------------------------------------------------------------------------


def npy_header_only(shape: str) -> bytes:
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header = header.ljust(117) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


# What the soak sends: (kind, the raw HTTP request, a check of the answer that says what is
# wrong with it, or None) for valid requests; (kind, the raw request, the status it must get)
Check = Callable[[int, bytes], str | None]
ValidRequest = tuple[str, bytes, Check]
InvalidRequest = tuple[str, bytes, int]


def http_request(
    path: str,
    body: bytes,
    content_type: str,
    accept: str = "application/json",
    method: str = "POST",
) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: soak\r\nContent-Type: {content_type}\r\n"
        f"Accept: {accept}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def invalid_requests(payload_limit: int) -> list[InvalidRequest]:
    """(kind, raw request, expected status) for the soak's hostile traffic."""
    row = ",".join(["1"] * 64).encode()
    return [
        ("not a number", http_request("/invocations", row[:-1] + b"x", "text/csv"), 400),
        ("NaN", http_request("/invocations", row[:-1] + b"nan", "text/csv"), 400),
        ("short row", http_request("/invocations", b"1,2,3", "text/csv"), 400),
        ("bad JSON", http_request("/invocations", b"[[1, 2", "application/json"), 400),
        (
            "negative .npy",
            http_request("/invocations", npy_header_only("(-1, 64)"), "application/x-npy"),
            400,
        ),
        (
            "absurd .npy",
            http_request(
                "/invocations", npy_header_only("(0, 100000000000000000000)"), "application/x-npy"
            ),
            400,
        ),
        (
            "punycode",
            http_request("/invocations", b"1-" + b"z" * 50000, "text/csv; charset=punycode"),
            415,
        ),
        ("text/plain", http_request("/invocations", row, "text/plain"), 415),
        ("Accept html", http_request("/invocations", row, "text/csv", "text/html"), 406),
        ("no such path", http_request("/predict", row, "text/csv"), 404),
        (
            "over the limit",
            http_request("/invocations", b"1," * (payload_limit // 2 + 1), "text/csv"),
            413,
        ),
    ]


@dataclass
class Soak:
    statuses: dict[str, dict[int, int]]
    wrong: list[str]

    def count(self, kind: str, status: int) -> None:
        self.statuses.setdefault(kind, {}).setdefault(status, 0)
        self.statuses[kind][status] += 1


SOAK_TIMEOUT_S = 60  # the server's request timeout in the soak run
SLOW_BYTE_S = 0.05  # a slow client sends a byte of its body this often


def slow_requests(valid: list[ValidRequest]) -> list[ValidRequest]:
    """The valid requests as a slow client sends them: one whose body takes longer than the
    request timeout to send (a 5-row JSON body: about 80 s) must be refused with a 408."""

    def refused(status: int, body: bytes) -> str | None:
        if status != 408 or "error" not in json.loads(body):
            return f"status {status}, expected 408: {body[:200]!r}"
        return None

    return [
        (kind, request, check)
        if len(request.split(b"\r\n\r\n", 1)[1]) * SLOW_BYTE_S < SOAK_TIMEOUT_S
        else (f"{kind}, too slow", request, refused)
        for kind, request, check in valid
    ]


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes, slow: bool
) -> tuple[int, bytes, bool]:
    """Send one request and read its answer: (status, body, whether the server closes). A slow
    client stops sending once answered: the server answers 408 at the deadline, body or not."""
    answer = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
    if slow:
        head, body = request.split(b"\r\n\r\n", 1)
        writer.write(head + b"\r\n\r\n")
        for byte in body:
            if answer.done():
                break
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(SLOW_BYTE_S)
    else:
        writer.write(request)
    head = await answer
    lower = head.lower()
    length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
    status = int(head[9:12])
    # after a 408 the server may close the connection, whatever its answer said
    closing = b"connection: close" in lower or status == 408
    return status, await reader.readexactly(length), closing


async def _soak_client(
    port: int,
    stop_at: float,
    soak: Soak,
    valid: list[ValidRequest],
    invalid: list[InvalidRequest],
    seed: int,
    slow: bool,
) -> None:
    rng = np.random.default_rng(seed)
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while time.monotonic() < stop_at:
        if connection is None:
            connection = await asyncio.open_connection("127.0.0.1", port)
        reader, writer = connection
        if slow or rng.random() < 0.7:
            kind, request, check = valid[rng.integers(len(valid))]
            status, body, closing = await _exchange(reader, writer, request, slow)
            soak.count(kind, status)
            problem = check(status, body)
            if problem:
                soak.wrong.append(f"{kind}: {problem}")
        else:
            kind, request, expected = invalid[rng.integers(len(invalid))]
            status, body, closing = await _exchange(reader, writer, request, False)
            soak.count(kind, status)
            if status != expected or "error" not in json.loads(body):
                soak.wrong.append(f"{kind}: status {status}, expected {expected}: {body[:200]!r}")
        if closing:
            writer.close()
            connection = None
    if connection is not None:
        connection[1].close()


def valid_requests(ml_root: Path, rows: npt.NDArray[Any]) -> list[ValidRequest]:
    """(kind, raw request, check) with the answers of the model run in this process."""
    import tensorflow as tf

    model = tf.keras.models.load_model(str(ml_root / "model" / SAVEDMODEL_PATH), compile=False)
    expected = model(rows.astype(np.float32), training=False).numpy()

    def check_json(indices: list[int]) -> Check:
        def check(status: int, body: bytes) -> str | None:
            if status != 200:
                return f"status {status}: {body[:200]!r}"
            predictions = json.loads(body)["predictions"]
            got = np.array([p["probabilities"] for p in predictions])
            if [p["class"] for p in predictions] != expected[indices].argmax(
                axis=1
            ).tolist() or not np.allclose(got, expected[indices], rtol=1e-4, atol=1e-6):
                return f"answer {predictions} differs from the model's"
            return None

        return check

    requests = [
        ("CSV row", http_request("/invocations", csv_row(rows[i]), "text/csv"), check_json([i]))
        for i in range(len(rows))
    ]
    for start in range(0, len(rows), 5):
        indices = list(range(start, min(start + 5, len(rows))))
        body = json.dumps({"instances": rows[indices].tolist()}).encode()
        requests.append(
            (
                "JSON 5 rows",
                http_request("/invocations", body, "application/json"),
                check_json(indices),
            )
        )
    return requests


def flood(
    server: Server, rows: npt.NDArray[Any], concurrency: int = 64, payload_mb: int = 6
) -> tuple[dict[int, int], float]:
    """`concurrency` posts of a `payload_mb` MB CSV body at once: statuses, seconds taken."""
    lines = [csv_row(row) for row in rows]
    body: list[bytes] = []
    size = 0
    while size < payload_mb * 1024 * 1024 - 200:
        line = lines[len(body) % len(lines)]
        body.append(line)
        size += len(line) + 1
    request = http_request("/invocations", b"\n".join(body), "text/csv", "text/csv")
    statuses: dict[int, int] = {}

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        status, _, _ = await _exchange(reader, writer, request, False)
        statuses[status] = statuses.get(status, 0) + 1
        writer.close()

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(concurrency)))

    start = time.monotonic()
    asyncio.run(main())
    return statuses, time.monotonic() - start


def soak(args: argparse.Namespace) -> bool:
    ml_root = ensure_model("mlp")
    rows = digits()[:64]
    valid = valid_requests(ml_root, rows)
    invalid = invalid_requests(6 * 1024 * 1024)
    soak_run = Soak({}, [])
    memory: list[tuple[float, float]] = []
    duration_s = args.soak_minutes * 60
    with started(SERVE, ml_root, {"SAGEMAKER_MODEL_SERVER_TIMEOUT": str(SOAK_TIMEOUT_S)}) as server:
        print(
            f"soak: serve workers {sorted(server.worker_rss_mb())}, resident "
            f"{sum(server.worker_rss_mb().values()):.0f} MB at start",
            flush=True,
        )
        statuses, seconds = flood(server, rows)
        peak = {
            pid: re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
            for pid in server.worker_rss_mb()
        }
        print(
            f"flood: 64 concurrent 6 MB CSV posts answered {statuses} in {seconds:.0f} s; "
            "peak resident memory per worker "
            f"{', '.join(f'{int(m.group(1)) / 1024:.0f} MB' for m in peak.values() if m)}",
            flush=True,
        )
        started_at = time.monotonic()
        stop_at = started_at + duration_s

        async def sample() -> None:
            while time.monotonic() < stop_at:
                memory.append((time.monotonic() - started_at, sum(server.worker_rss_mb().values())))
                await asyncio.sleep(5)

        async def main() -> None:
            clients = [
                _soak_client(server.port, stop_at, soak_run, valid, invalid, seed, False)
                for seed in range(64)
            ]
            clients += [
                _soak_client(
                    server.port, stop_at, soak_run, slow_requests(valid), invalid, seed, True
                )
                for seed in range(64, 68)
            ]
            await asyncio.gather(sample(), *clients)

        asyncio.run(main())
        alive = server.process.poll() is None and len(server.worker_rss_mb()) > 0
    return soak_report(soak_run, memory, duration_s, alive, statuses)


def soak_report(
    soak_run: Soak,
    memory: list[tuple[float, float]],
    duration_s: float,
    alive: bool,
    flood_statuses: dict[int, int],
) -> bool:
    total = sum(sum(counts.values()) for counts in soak_run.statuses.values())
    print(
        f"\nsoak: {total} requests in {duration_s:.0f} s at concurrency 64 plus 4 slow "
        f"clients ({total / duration_s:.0f} requests/s)"
    )
    for kind, counts in sorted(soak_run.statuses.items()):
        print(f"  {kind:<15} {dict(sorted(counts.items()))}")
    server_errors = sum(
        n for counts in soak_run.statuses.values() for status, n in counts.items() if status >= 500
    )
    server_errors += sum(
        n for status, n in flood_statuses.items() if status >= 500 and status != 503
    )
    warm = [rss for at, rss in memory if at >= duration_s * 0.25]
    growth = (max(warm) / warm[0] - 1) if warm else float("nan")
    print(
        "  resident memory of the workers, MB: "
        + ", ".join(f"{at:.0f}s {rss:.0f}" for at, rss in memory[:: max(1, len(memory) // 12)])
    )
    print(
        f"  after warm-up (the first quarter): from {warm[0]:.0f} to at most {max(warm):.0f} "
        f"MB ({100 * growth:+.1f} %)"
        if warm
        else "  no memory samples"
    )
    for problem in soak_run.wrong[:10]:
        print(f"  WRONG {problem}")
    checks = {
        "no 5xx": server_errors == 0,
        "every answer right": not soak_run.wrong,
        "memory flat within 10 %": warm and growth <= 0.10,
        "server alive": alive,
    }
    print("soak: " + ", ".join(f"{name} {'yes' if ok else 'NO'}" for name, ok in checks.items()))
    return all(checks.values())


# --- main ------------------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=4, help="runs per cell (median)")
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn")
    parser.add_argument("--soak", action="store_true", help="the soak run instead")
    parser.add_argument("--soak-minutes", type=float, default=3.0)
    parser.add_argument("--baseline-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--ml-root", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args, started_at = parse_arguments(argv), time.time()
    if args.baseline_server:
        run_baseline_server(args.baseline_server, args.ml_root)
        return 0
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start (other "
        "processes skew absolute numbers; the interleaved ratios much less)",
        flush=True,
    )
    if args.soak:
        ok = soak(args)
    else:
        wrk_path = ensure_wrk()
        with tempfile.TemporaryDirectory() as workdir:
            tables = {
                name: bench_model(name, wrk_path, args, Path(workdir))
                for name in args.models.split(",")
            }
        ok = report(tables, started_at)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
