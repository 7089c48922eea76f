"""Item 6: peak resident memory (the kernel's VmHWM) of a training rank and of a serving worker.

- per rank: sampled while the item 2 jobs run (bench.jobs.PeakMemory); the largest
  rank of the 2-rank runs;
- serving: `serve --ml-root DIR` (gunicorn master + one worker) on the model a benchmark job
  exported, after `requests` CSV predictions; the worker's peak. One worker: each worker is
  its own process with its own model, so its peak does not depend on how many there are, and
  a second would only add a TensorFlow start-up;
- reference for both: a bare `python -c "import tensorflow, horovod.tensorflow"`, the floor
  any process of this stack starts from.
No targets: these rows say what an instance must hold, per rank and per server worker.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench.cluster import BARE_IMPORT
from bench.jobs import PeakMemory, peak_rss
from bench.launch import PYTHON, log, stop
from bench.results import Measurement
from container.network import free_port

MB = 1024 * 1024
SERVE = Path(PYTHON).with_name("serve")
READY_TIMEOUT = 180


def bare_import_rss() -> int:
    """VmHWM of a process that imported TensorFlow and Horovod and nothing else."""
    code = (
        f"{BARE_IMPORT}\nfrom bench.jobs import peak_rss\nimport os\nprint(peak_rss(os.getpid()))"
    )
    done = subprocess.run(
        [PYTHON, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return int(done.stdout.split()[-1])


def _get(url: str, body: bytes | None = None) -> int:
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "text/csv"} if body else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            status: int = response.status  # urlopen's answer is untyped: an HTTPResponse here
            return status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


def serving_peak_rss(ml_root: Path, features: int, requests: int) -> dict[str, Any]:
    """Peak RSS of the serve master and its one worker after `requests` predictions."""
    port = free_port()
    argv = [str(SERVE), "--ml-root", str(ml_root)]
    env = {"SAGEMAKER_BIND_TO_PORT": str(port), "SAGEMAKER_MODEL_SERVER_WORKERS": "1"}
    log(f"serving: {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(argv)}")
    with open(ml_root / "serve.log", "w") as errors:  # a file: a full pipe would block the server
        process = subprocess.Popen(
            argv,
            stdout=errors,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
        base = f"http://127.0.0.1:{port}"
        try:
            with PeakMemory(process.pid, None, interval=0.1) as memory:
                deadline = time.monotonic() + READY_TIMEOUT
                while _get(f"{base}/ping") != 200:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"serve never answered /ping with 200 within "
                            f"{READY_TIMEOUT} s on port {port}; see "
                            f"{ml_root / 'serve.log'}"
                        )
                    time.sleep(0.2)
                rows = np.random.default_rng(0).standard_normal((64, features))
                body = "\n".join(",".join(f"{v:.5g}" for v in row) for row in rows).encode()
                statuses = [_get(f"{base}/invocations", body) for _ in range(requests)]
                if set(statuses) != {200}:
                    raise RuntimeError(f"serve answered /invocations with {sorted(set(statuses))}")
                memory.sample()
            master = peak_rss(process.pid) or 0
            workers = [peak for pid, peak in memory.peaks.items() if pid != process.pid]
        finally:
            stop(process)
    return {
        "master_bytes": master,
        "worker_bytes": workers,
        "requests": requests,
        "rows_per_request": 64,
    }


def measure(
    rank_peaks: list[int], model_root: Path | None, features: int, requests: int
) -> list[Measurement]:
    bare = bare_import_rss()
    rows = [
        Measurement(
            item=6,
            metric="peak RSS per rank (2-rank trainer job)",
            unit="MB",
            value=max(rank_peaks) / MB if rank_peaks else None,
            reference=bare / MB,
            reference_name="bare import tensorflow+horovod",
            details={"rank_peak_rss_bytes": rank_peaks, "bare_import_bytes": bare},
        )
    ]
    if model_root is not None:
        serving = serving_peak_rss(model_root, features, requests)
        rows.append(
            Measurement(
                item=6,
                metric="peak RSS of the serving worker",
                unit="MB",
                value=max(serving["worker_bytes"]) / MB if serving["worker_bytes"] else None,
                reference=bare / MB,
                reference_name="bare import tensorflow+horovod",
                note=f"master {serving['master_bytes'] / MB:.0f} MB",
                details=serving,
            )
        )
    return rows
