"""Item 10: what a restart inside the job (`max_restarts`) costs.

Item 4's 2-host loopback job (one optimizer step per epoch, so each METRICS line marks a
step), with a checkpoint every CADENCE epochs and `max_restarts=1`. Once the leader reports
epoch KILL_AFTER, the worker host's rank gets SIGKILL (the out-of-memory killer's signature).
Measured from the leader's log, on this process's clock:

- restart: the kill to the first step trained again (the leader notices the failure, mpirun
  ends the other rank, and every rank starts again, reads the checkpoint and traces its step);
  reference: the same job's first start to its first step, in the same run (what any restart
  from scratch costs at least, before SageMaker provisions anything);
- steps lost: the last step reported before the restart minus the step the job resumed at,
  to be no more than the cadence allows.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from bench.cluster import LOOPBACK_HOSTS, run_loopback
from bench.jobs import rank_pid
from bench.results import Measurement, Target
from bench.sizes import Sizes
from job.protocol import parse_metrics

CADENCE = 4  # checkpoint_every_epochs: at most this many steps are lost
KILL_AFTER = 10  # the epoch (= step) after which the worker's rank is killed
# Enough that the job is still training when the kill lands, at any size (a step lasts tens of
# milliseconds; the kill lands a few steps after the line), and no more: every epoch after the
# restart, to the end, costs both ranks a step, a METRICS line and every CADENCE a checkpoint.
EPOCHS = 40
RESUMED = re.compile(r"trainer: resumed from \S+ at epoch (\d+)")


def measure(sizes: Sizes, workdir: Path) -> list[Measurement]:
    killed: dict[str, float] = {}
    leader_root = workdir / f"loopback-{LOOPBACK_HOSTS[0]}"

    def kill_in_flight(line: str, worker: subprocess.Popen[str]) -> None:
        if not killed and f"METRICS epoch={KILL_AFTER} " in line:
            rank = rank_pid(1, leader_root)  # the worker host's
            if rank is None:
                raise RuntimeError("rank 1 of the restart job was not found")
            killed["at"] = time.time()
            os.kill(rank, signal.SIGKILL)

    timeline = run_loopback(
        sizes,
        workdir,
        extra={"epochs": str(EPOCHS), "checkpoint_every_epochs": str(CADENCE), "max_restarts": "1"},
        watch=kill_in_flight,
    )
    if not killed:
        raise RuntimeError(f"the job never reported epoch {KILL_AFTER}")
    lines = timeline.lines
    restarted = next(i for i, (_, line) in enumerate(lines) if "restarting every rank" in line)
    reported = [
        metrics["epoch"]
        for _, line in lines[:restarted]
        if (metrics := parse_metrics(line)) is not None
    ]
    resumed = next(
        int(found[1]) for _, line in lines[restarted:] if (found := RESUMED.search(line))
    )
    first_again = next(t for t, line in lines[restarted:] if parse_metrics(line) is not None)
    lost = int(max(reported)) - (resumed - 1)
    seconds = first_again - killed["at"]
    details = {
        "kill_to_restart_line": lines[restarted][0] - killed["at"],
        "restart_line_to_resumed": next(t for t, line in lines[restarted:] if RESUMED.search(line))
        - lines[restarted][0],
        "killed_at": killed["at"],
        "reported_before_restart": max(reported),
        "resumed_at_epoch": resumed,
        "first_step_again": first_again,
        "breakdown_seconds": timeline.breakdown(),
    }
    return [
        Measurement(
            item=10,
            metric="restart in the job: rank killed to first step again, 2 launchers on loopback",
            unit="s",
            value=seconds,
            reference=timeline.startup(),
            reference_name="the job's own first start to first step",
            target=Target("value", "<=", 30.0),
            details=details,
        ),
        Measurement(
            item=10,
            metric=f"restart in the job: steps lost (checkpoint every {CADENCE} steps)",
            unit="steps",
            value=float(lost),
            target=Target("value", "<=", float(CADENCE)),
            details=details,
        ),
    ]
