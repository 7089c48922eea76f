"""Benchmark of the inference server (`make bench-serve`); a measurement, not a test.

On one model (the default job's digits classifier) and this machine, it measures requests/s
and p50/p99 latency at concurrency 1, 8 and 32 of:
  (a) serve     this server: `serve --ml-root DIR` (gunicorn gthread, micro-batching);
  (b) baseline  the classic SageMaker bring-your-own-container predictor (Flask on gunicorn
                sync workers, one per CPU, one `model.predict` per request), written below;
  (c) in-proc   `model.predict` on batches of `concurrency` instances in this process, no
                HTTP: what the model gives if every request were batched and HTTP were free;
  (c') forward  the same batches through the traced forward pass that (a) calls: the cost
                of the model alone.
Every request is one CSV row (one instance) sent by `concurrency` keep-alive clients of an
asyncio load generator; (b)'s sync workers close each connection, so its clients reconnect,
as they would against the classic example. For (c) and (c') a "request" is one instance and
the latency is that of the batch call. It prints a table and the ratios a/b and a/c.

    python scripts/bench_serve.py [--ml-root build/bench-serve] [--duration 5] [--warmup 1]

Without a trained model under ML_ROOT/model it first runs `scripts/default_job.py` there.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from container.network import free_port
from serve.metadata import SAVEDMODEL_PATH

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCIES = (1, 8, 32)
TARGET_CONCURRENCY = 32
SERVE, BASELINE = "(a) serve", "(b) BYOC baseline"
PREDICT, FORWARD = "(c) in-proc predict", "(c') forward only"


@dataclass
class Result:
    name: str
    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int = 0


# --- (b): the classic BYOC predictor, as in scikit_bring_your_own/container/predictor.py ----

def baseline_app(model_path: str):
    """The classic example's Flask app: lazy model load, CSV in, model.predict per request."""
    import flask

    class ScoringService:
        model = None

        @classmethod
        def get_model(cls):
            if cls.model is None:
                import tensorflow as tf

                cls.model = tf.keras.models.load_model(model_path, compile=False)
            return cls.model

        @classmethod
        def predict(cls, data):
            return cls.get_model().predict(data, verbose=0)

    app = flask.Flask("baseline")

    @app.route("/ping", methods=["GET"])
    def ping():
        healthy = ScoringService.get_model() is not None
        return flask.Response(response="\n", status=200 if healthy else 404,
                              mimetype="application/json")

    @app.route("/invocations", methods=["POST"])
    def transformation():
        if flask.request.content_type != "text/csv":
            return flask.Response(response="This predictor only supports CSV data", status=415,
                                  mimetype="text/plain")
        data = np.loadtxt(io.StringIO(flask.request.data.decode("utf-8")), delimiter=",",
                          ndmin=2)
        probabilities = ScoringService.predict(data)
        out = io.StringIO()
        np.savetxt(out, np.column_stack([probabilities.argmax(axis=1), probabilities]),
                   delimiter=",", fmt="%.9g")
        return flask.Response(response=out.getvalue(), status=200, mimetype="text/csv")

    return app


def run_baseline_server(port: int, model_path: str) -> None:
    from gunicorn.app.base import BaseApplication

    class Baseline(BaseApplication):
        def load_config(self):
            for name, value in {"bind": [f"127.0.0.1:{port}"], "workers": os.cpu_count(),
                                "worker_class": "sync", "timeout": 60, "accesslog": None,
                                "control_socket_disable": True, "loglevel": "warning"}.items():
                self.cfg.set(name, value)

        def load(self):
            return baseline_app(model_path)

    Baseline().run()


# --- the load generator ----------------------------------------------------------------------

async def _client(port: int, request: bytes, measure_from: float, stop_at: float,
                  latencies: list[float], errors: list[int]) -> None:
    reader = writer = None
    while time.perf_counter() < stop_at:
        start = time.perf_counter()
        if writer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        headers = head.lower()
        length = int(headers.split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        if start >= measure_from:
            latencies.append(time.perf_counter() - start)
            if head[9:12] != b"200":
                errors.append(int(head[9:12]))
        if b"connection: close" in headers:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


def load_test(name: str, port: int, rows: np.ndarray, concurrency: int, warmup_s: float,
              duration_s: float) -> Result:
    """`concurrency` clients send one CSV row each, over and over, for warmup + duration."""
    requests = []
    for row in rows[:concurrency]:
        body = ",".join(f"{value:g}" for value in row).encode()
        requests.append(b"POST /invocations HTTP/1.1\r\nHost: bench\r\nContent-Type: text/csv\r\n"
                        b"Accept: text/csv\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    latencies: list[float] = []
    errors: list[int] = []

    async def main() -> None:
        now = time.perf_counter()
        measure_from, stop_at = now + warmup_s, now + warmup_s + duration_s
        await asyncio.gather(*(_client(port, request, measure_from, stop_at, latencies, errors)
                               for request in requests))

    asyncio.run(main())
    return _result(name, concurrency, latencies, len(latencies) / duration_s, len(errors))


def _result(name: str, concurrency: int, latencies: list[float], rate: float,
            errors: int = 0) -> Result:
    p50, p99 = np.percentile(np.array(latencies) * 1000, [50, 99])
    return Result(name, concurrency, rate, float(p50), float(p99), errors)


# --- servers and the in-process bound --------------------------------------------------------

def wait_until_healthy(port: int, process: subprocess.Popen, timeout_s: float = 300) -> None:
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
    raise RuntimeError(f"the server on port {port} did not answer /ping with 200 in "
                       f"{timeout_s:.0f} s")


def measure_server(name: str, command: list[str], env: dict[str, str], port: int,
                   rows: np.ndarray, args: argparse.Namespace) -> list[Result]:
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until_healthy(port, process)
        # Every worker answers before measuring: the baseline loads its model on first use.
        load_test(name, port, rows, 8, 0, args.warmup + 2)
        results = []
        for concurrency in CONCURRENCIES:
            results.append(load_test(name, port, rows, concurrency, args.warmup, args.duration))
            print(_row(results[-1]), flush=True)
        return results
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def measure_in_process(model_dir: Path, rows: np.ndarray, duration_s: float) -> list[Result]:
    import tensorflow as tf

    model = tf.keras.models.load_model(str(model_dir / SAVEDMODEL_PATH), compile=False)
    forward = tf.function(lambda batch: model(batch, training=False),
                          input_signature=[tf.TensorSpec((None, rows.shape[1]), tf.float32)])
    ways = {PREDICT: lambda batch: model.predict(batch, verbose=0),
            FORWARD: lambda batch: forward(batch).numpy()}
    results = []
    for name, call in ways.items():
        for concurrency in CONCURRENCIES:
            batch = rows[:concurrency].astype(np.float32)
            call(batch)
            latencies = []
            stop_at = time.perf_counter() + duration_s
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                call(batch)
                latencies.append(time.perf_counter() - start)
            rate = concurrency * len(latencies) / sum(latencies)
            results.append(_result(name, concurrency, latencies, rate))
            print(_row(results[-1]), flush=True)
    return results


# --- the report ------------------------------------------------------------------------------

HEADER = f"{'server':<22} {'conc':>4} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"


def _row(result: Result) -> str:
    return (f"{result.name:<22} {result.concurrency:>4} {result.requests_per_s:>9.0f} "
            f"{result.p50_ms:>8.2f} {result.p99_ms:>8.2f} {result.errors:>6}")


def report(results: list[Result]) -> None:
    by = {(r.name, r.concurrency): r for r in results}
    print("\n" + HEADER)
    for result in sorted(results, key=lambda r: (r.concurrency, r.name)):
        print(_row(result))
    print(f"\n{'conc':>4} {'a/b req/s':>10} {'a/c req/s':>10} {'a/c2 req/s':>11} "
          f"{'p99 a/b':>8}    (c2 = c', the forward pass alone)")
    for concurrency in CONCURRENCIES:
        a, b, c, c2 = (by[(name, concurrency)] for name in (SERVE, BASELINE, PREDICT, FORWARD))
        print(f"{concurrency:>4} {a.requests_per_s / b.requests_per_s:>10.2f} "
              f"{a.requests_per_s / c.requests_per_s:>10.2f} "
              f"{a.requests_per_s / c2.requests_per_s:>11.3f} {a.p99_ms / b.p99_ms:>8.2f}")
    a, b, c = (by[(name, TARGET_CONCURRENCY)] for name in (SERVE, BASELINE, PREDICT))
    checks = {"a/b >= 3": a.requests_per_s >= 3 * b.requests_per_s,
              "a/c >= 0.5": a.requests_per_s >= 0.5 * c.requests_per_s,
              "p99 a <= p99 b": a.p99_ms <= b.p99_ms}
    print(f"\ntargets at concurrency {TARGET_CONCURRENCY}: " + ", ".join(
        f"{name} {'met' if met else 'MISSED'}" for name, met in checks.items()))


def ensure_model(ml_root: Path) -> None:
    if (ml_root / "model" / "metadata.json").exists():
        return
    print(f"no model under {ml_root}/model: training the default job there first", flush=True)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "default_job.py"), "--ml-root",
                    str(ml_root), "--epochs", "2"], check=True)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ml-root", type=Path, default=ROOT / "build" / "bench-serve")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--baseline-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    model_dir = args.ml_root.resolve() / "model"
    if args.baseline_server:
        run_baseline_server(args.baseline_server, str(model_dir / SAVEDMODEL_PATH))
        return
    ensure_model(args.ml_root.resolve())
    from sklearn.datasets import load_digits

    rows = load_digits().data[:max(CONCURRENCIES)]
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other processes "
          f"skew every number); model {model_dir}; {args.duration:g} s per cell\n{HEADER}")
    serve_port, baseline_port = free_port(), free_port()
    serve = [str(Path(sys.executable).parent / "serve"), "--ml-root", str(args.ml_root)]
    results = measure_server(SERVE, serve,
                             {**os.environ, "SAGEMAKER_BIND_TO_PORT": str(serve_port)},
                             serve_port, rows, args)
    baseline = [sys.executable, __file__, "--ml-root", str(args.ml_root),
                "--baseline-server", str(baseline_port)]
    results += measure_server(BASELINE, baseline, dict(os.environ), baseline_port,
                              rows, args)
    results += measure_in_process(model_dir, rows, args.duration)
    report(results)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
