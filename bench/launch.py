"""Starting benchmark processes: the mpirun argv (built by the launcher's own option builder,
so the benchmarks see the transport the trainer gets) and a logged, deadline-bound run."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from container import mpirun
from container.plan import rank_command

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TRAIN = Path(sys.executable).with_name("train")


def mpirun_argv(
    ranks: int,
    module: str,
    arguments: Sequence[str],
    rank_env: Mapping[str, str],
    extra_options: str = "",
) -> list[str]:
    """`mpirun <the launcher's single-host defaults> python -P -m mpi4py -m MODULE ARGS`;
    `extra_options` overrides or extends them as the `mpi_options` hyperparameter does."""
    command = mpirun.Command(
        hosts=("localhost",),
        processes_per_host=ranks,
        interface="lo",
        instance_type="local",
        ssh_args=None,
        environment={
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            **rank_env,
        },
        program=tuple(rank_command(PYTHON, module, *arguments)),
        user_options=tuple(mpirun.parse_options(extra_options)),
    )
    return list(mpirun.render(command))


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run(
    argv: Sequence[str], *, timeout: float, what: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run to completion; RuntimeError naming `what` with the output's tail on failure."""
    log(f"{what}: {shlex.join(argv)}")
    try:
        done = subprocess.run(
            list(argv),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as expired:
        raise RuntimeError(f"{what} did not finish within {timeout:.0f} s") from expired
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"{what} failed with exit code {done.returncode}:\n{tail}")
    return done


def stop(process: subprocess.Popen[str] | subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; returns once the process is gone."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
