"""Item 4: what forming and dissolving the cluster costs around the training itself.

A 2-host job of the built-in trainer with one optimizer step per epoch, so the first METRICS
line marks the end of the first training step and the last one the end of the last step:

- startup overhead = (first step done - first host started) - bare import, where the bare
  import is `python -c "import tensorflow, horovod.tensorflow"` started the same way, once per
  host and all at once (2 containers of the same image, or 2 plain processes: the two hosts
  share this machine's cores, so their imports slow each other down in both cases). What is
  left is the launcher's work (config, name resolution, ssh key, sshd, coordinator, mpirun
  over ssh), Keras' import, Horovod's init, reading the data, building the model and tracing
  the first step (the JSON has the breakdown, from the leader's log lines).
- teardown = every host exited - last step done: verifying the weights, exporting the model,
  mpirun's exit, the leader reporting the outcome, the workers exiting.

Two ways to run the same job, named in the table:
- `containers`: the local compose cluster of the container issue (scripts/local_cluster.py:
  algo-1, algo-2 on their own network, `train` as PID 1), times from the engine: State
  StartedAt/FinishedAt and the log's per-line timestamps (`<engine> logs -t`).
- `loopback`: two launchers on this machine, hosts 127.0.0.1 and 127.0.0.2, each with its
  own sshd and tree (as tests/container/test_multi_host.py does); times from this process's
  clock when each line arrives.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy.typing as npt

from bench.jobs import DataShape, synthetic, write_job, write_npz
from bench.launch import PYTHON, TRAIN, log
from bench.results import Measurement, Target, median
from bench.sizes import Sizes
from container.network import free_ports
from job.protocol import parse_mark, parse_metrics
from scripts.local_cluster import ClusterSpec, ComposeCluster, Engine, write_cluster

BARE_IMPORT = "import tensorflow, horovod.tensorflow"
LOOPBACK_HOSTS = ("127.0.0.1", "127.0.0.2")
MODES = ("containers", "loopback")
TIMEOUT = 300
# A 2-host run is timed by the leader's structured lines (job.protocol): every METRICS
# line, and the first TRAIN-MARK of each kind (for the breakdown in the JSON).
TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?")


def parse_timestamp(text: str) -> float:
    """Seconds since the epoch from an RFC 3339 time with up to nanoseconds (what podman and
    docker print); ValueError when `text` does not start with one."""
    match = TIMESTAMP.match(text.strip())
    if not match:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    whole, fraction, zone = match.groups()
    zone = "+00:00" if zone in (None, "Z") else zone
    seconds = datetime.fromisoformat(whole + zone).timestamp()
    return seconds + (float(fraction) if fraction else 0.0)


@dataclass
class Timeline:
    """Seconds (one clock) of the events a 2-host run is measured by."""

    hosts_started: list[float]
    hosts_exited: list[float]
    steps: list[float]  # each METRICS line of the leader
    marks: dict[str, float] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    lines: list[tuple[float, str]] = field(default_factory=list)  # the leader's, timed

    def startup(self) -> float:
        return self.steps[0] - min(self.hosts_started)

    def teardown(self) -> float:
        return max(self.hosts_exited) - self.steps[-1]

    def breakdown(self) -> dict[str, float]:
        """Seconds between consecutive events, in order, from the first host's start."""
        events = [
            ("first host started", min(self.hosts_started)),
            *[(name, t) for name, t in self.marks.items()],
            ("first step done", self.steps[0]),
            ("last step done", self.steps[-1]),
            ("last host exited", max(self.hosts_exited)),
        ]
        events.sort(key=lambda event: event[1])
        return {f"{a} -> {b}": round(tb - ta, 3) for (a, ta), (b, tb) in zip(events, events[1:])}


def mark_times(lines: Sequence[tuple[float, str]]) -> tuple[list[float], dict[str, float]]:
    """(times of the METRICS lines, {mark: time of its first line}) from (time, line) pairs."""
    steps = [t for t, line in lines if parse_metrics(line) is not None]
    marks: dict[str, float] = {}
    for t, line in lines:
        mark = parse_mark(line)
        if mark is not None:
            marks.setdefault(mark.value, t)
    return steps, marks


def job_hyperparameters(sizes: Sizes) -> dict[str, str]:
    """One optimizer step per epoch: 2 hosts x 1 rank x per_device_batch = all samples."""
    return {
        "model": "mlp",
        "hidden_units": sizes.hidden_units,
        "epochs": str(sizes.cluster_epochs),
        "processes_per_host": "1",
        "per_device_batch_size": str(sizes.per_device_batch),
        "max_device_batch_size": str(sizes.per_device_batch),
        "checkpoint_every_epochs": "0",
        "warmup_epochs": "0",
    }


def cluster_data(sizes: Sizes) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    return synthetic(DataShape(2 * sizes.per_device_batch, sizes.features))


# ------------------------------------------------------------------------- loopback -----
def bare_import_seconds(repeats: int, hosts: int = 2) -> list[float]:
    """Wall seconds of `hosts` plain `python -c BARE_IMPORT` processes started together (the
    2-host cluster's ranks import at the same time on this one machine)."""
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        processes = [
            subprocess.Popen(
                [PYTHON, "-c", BARE_IMPORT], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for _ in range(hosts)
        ]
        if any(process.wait(timeout=TIMEOUT) for process in processes):
            raise RuntimeError(f"python -c {BARE_IMPORT!r} failed")
        timings.append(time.perf_counter() - started)
    return timings


def run_loopback(
    sizes: Sizes,
    workdir: Path,
    extra: Mapping[str, str] | None = None,
    watch: Callable[[str, subprocess.Popen[str]], None] | None = None,
) -> Timeline:
    """The 2-host job on loopback (`extra` hyperparameters over item 4's); `watch` sees each
    line of the leader as it comes, with the worker's launcher (to act on it mid-run)."""
    sshd, coordinator = free_ports(2)
    hyperparameters = {
        **job_hyperparameters(sizes),
        **(extra or {}),
        "sshd_port": str(sshd),
        "coordinator_port": str(coordinator),
        "host_timeout": "120",
        "leader_timeout": "120",
        "heartbeat_timeout": "10",
    }
    data = cluster_data(sizes)
    roots = []
    for host in LOOPBACK_HOSTS:
        root = workdir / f"loopback-{host}"
        shutil.rmtree(root, ignore_errors=True)
        roots.append(
            write_job(root, hyperparameters, data, hosts=LOOPBACK_HOSTS, current_host=host)
        )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log(f"cluster (loopback): {TRAIN} --ml-root ... on {', '.join(LOOPBACK_HOSTS)}")
    worker_log = workdir / "loopback-worker.log"
    started, processes = [], []
    with open(worker_log, "w") as worker_output:
        for root, output in ((roots[1], worker_output), (roots[0], subprocess.PIPE)):
            started.append(time.time())  # the worker first: it waits for the leader
            processes.append(
                subprocess.Popen(
                    [str(TRAIN), "--ml-root", str(root)],
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
            )
    worker, leader = processes
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in leader.stdout or ():  # a pipe: stdout=PIPE above
            lines.append((time.time(), line))
            if watch is not None:
                watch(line, worker)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    exited = []
    deadline = time.monotonic() + TIMEOUT
    try:
        for process in (leader, worker):
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
            exited.append(time.time())
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"the loopback cluster did not finish within {TIMEOUT} s:\n"
            f"{''.join(line for _, line in lines)[-2000:]}"
        ) from None
    finally:
        for process in processes:  # their sshd and mpirun too: each launcher's own group
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    reader.join(timeout=10)
    if leader.returncode or worker.returncode:
        raise RuntimeError(
            f"the loopback cluster failed (leader {leader.returncode}, worker "
            f"{worker.returncode}):\n{''.join(text for _, text in lines)[-2000:]}\n"
            f"worker: {worker_log.read_text()[-1000:]}"
        )
    steps, marks = mark_times(lines)
    if not steps:
        raise RuntimeError("the loopback cluster printed no METRICS line")
    return Timeline(started, exited, steps, marks, lines=lines)


# ------------------------------------------------------------------------ containers ----
def image_exists(engine: Engine, image: str) -> bool:
    return engine.run("image", "inspect", image, check=False, timeout=60).returncode == 0


def container_times(engine: Engine, container: str) -> tuple[float, float, int]:
    state = json.loads(
        engine.run("inspect", "--format", "{{json .State}}", container, timeout=60).stdout
    )
    return (
        parse_timestamp(state["StartedAt"]),
        parse_timestamp(state["FinishedAt"]),
        int(state.get("ExitCode", -1)),
    )


def timestamped_logs(engine: Engine, container: str) -> list[tuple[float, str]]:
    result = engine.run("logs", "-t", container, check=False, timeout=60)
    lines = []
    for line in (result.stdout + result.stderr).splitlines():
        stamp, _, text = line.partition(" ")
        try:
            lines.append((parse_timestamp(stamp), text))
        except ValueError:
            continue
    return lines


def bare_import_in_container(
    engine: Engine, image: str, repeats: int, hosts: int = 2
) -> list[float]:
    """Seconds from the first start to the last exit of `hosts` containers of `image` that
    run only `python -c BARE_IMPORT`, started together."""
    timings = []
    for index in range(repeats):
        names = [f"bench-bare-import-{index}-{host}-{int(time.time())}" for host in range(hosts)]
        runs = [
            subprocess.Popen(
                [
                    engine.name,
                    "run",
                    "--pull=never",
                    "--name",
                    name,
                    image,
                    "python",
                    "-c",
                    BARE_IMPORT,
                ],
                env=dict(engine.env),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in names
        ]
        try:
            for run_ in runs:
                if run_.wait(timeout=TIMEOUT):
                    raise RuntimeError(
                        f"{engine.name} run {image} python -c "
                        f"{BARE_IMPORT!r} failed: {(run_.stderr or io.StringIO()).read()[-500:]}"
                    )
            times = [container_times(engine, name) for name in names]
            timings.append(max(t[1] for t in times) - min(t[0] for t in times))
        finally:
            engine.run("rm", "-f", *names, check=False, timeout=60)
    return timings


def run_containers(sizes: Sizes, workdir: Path, engine: Engine, image: str) -> Timeline:
    data_dir = workdir / "cluster-data"
    shutil.rmtree(data_dir, ignore_errors=True)
    write_npz(data_dir / "train", *cluster_data(sizes))
    spec = ClusterSpec(
        hosts=2,
        workdir=workdir / "cluster",
        data=data_dir,
        image=image,
        hyperparameters=job_hyperparameters(sizes),
        job_name="bench",
    )
    cluster = ComposeCluster(engine, write_cluster(spec), f"bench{int(time.time())}")
    log(f"cluster (containers): compose up of {cluster.compose_path} ({image})")
    try:
        up = cluster.compose(
            "up", "--abort-on-container-exit", check=False, capture=True, timeout=TIMEOUT
        )
        cluster.wait_all_exited(60)
        containers = cluster.containers()
        times = {host: container_times(engine, cid) for host, cid in containers.items()}
        leader_lines = timestamped_logs(engine, containers["algo-1"])
    finally:
        cluster.down()
    codes = {host: code for host, (_, _, code) in times.items()}
    if len(codes) != 2 or any(codes.values()):
        raise RuntimeError(
            f"the container cluster failed (exit codes {codes}):\n{(up.stdout + up.stderr)[-2000:]}"
        )
    steps, marks = mark_times(leader_lines)
    if not steps:
        raise RuntimeError("the leader container logged no METRICS line")
    return Timeline(
        [t[0] for t in times.values()],
        [t[1] for t in times.values()],
        steps,
        marks,
        {"image": image},
    )


# ---------------------------------------------------------------------------- measure ---
def measure(sizes: Sizes, workdir: Path, *, image: str, mode: str = "auto") -> list[Measurement]:
    """Startup overhead and teardown rows, from the container cluster when `mode` allows and
    an engine and the image are there, else from two launchers on loopback."""
    if mode not in ("auto", *MODES):
        raise ValueError(f"Unknown cluster mode: {mode}. Choose between auto, {', '.join(MODES)}.")
    engine, why = None, ""
    if mode in ("auto", "containers"):
        try:
            engine = Engine.detect()
            if not image_exists(engine, image):
                why, engine = f"image {image} not built (make build)", None
        except (RuntimeError, subprocess.SubprocessError) as error:
            why, engine = f"no container engine answers: {error}", None
        if engine is None and mode == "containers":
            raise RuntimeError(f"cannot measure the container cluster: {why}")
    repeats = 3 if sizes.repeats > 1 else 1
    if engine is not None:
        used = "containers"
        bare = bare_import_in_container(engine, image, repeats)
        timeline = run_containers(sizes, workdir, engine, image)
    else:
        used = "loopback"
        bare = bare_import_seconds(repeats)
        timeline = run_loopback(sizes, workdir)
        if why:
            timeline.notes["why_not_containers"] = why
    bare_seconds = median(bare)
    if bare_seconds is None:  # each repeat times one start: there are none only without repeats
        raise RuntimeError("no bare import was timed, so startup overhead has no reference")
    startup = timeline.startup()
    where = (
        "2 containers (compose)" if used == "containers" else "2 launchers on 127.0.0.1/127.0.0.2"
    )
    details = {
        "mode": used,
        "bare_import_seconds": bare,
        "start_to_first_step": startup,
        "breakdown_seconds": timeline.breakdown(),
        "hosts_started": timeline.hosts_started,
        "hosts_exited": timeline.hosts_exited,
        "steps": timeline.steps,
        "marks": timeline.marks,
        **timeline.notes,
    }
    teardown = timeline.teardown()
    exported = timeline.marks.get("model_exported")
    export = None if exported is None else exported - timeline.steps[-1]
    return [
        Measurement(
            item=4,
            metric=f"startup overhead, {where}",
            unit="s",
            value=startup - bare_seconds,
            reference=bare_seconds,
            reference_name="bare import tensorflow+horovod, 2 at once",
            target=Target("value", "<=", 5.0),
            note=f"start to first step done {startup:.1f} s",
            details=details,
        ),
        Measurement(
            item=4,
            metric=f"teardown (last step to all exited), {where}",
            unit="s",
            value=teardown,
            reference=30.0,
            reference_name="SageMaker toolkit's fixed sleeps",
            target=Target("value", "<=", 3.0),
            note="" if export is None else f"of which last step to model exported {export:.1f} s",
            details=details,
        ),
    ]
