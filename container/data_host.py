"""A data host: a host of a heterogeneous job's instance group that runs no rank.

SageMaker jobs may mix instance groups (GPU hosts that train beside CPU hosts that read and
decode the data). mpirun spans only the training groups' hosts (container.plan); every other
host runs the user's script on its own, not under mpirun, as AWS's toolkit does, with the same
SM_* environment (SM_CURRENT_INSTANCE_GROUP says which group it is in), or for the built-in
trainer the tf.data service that produces the ranks' input (train.data_service). Unlike the
toolkit's, its life is the job's: it joins the leader's coordinator as a worker does (with no
sshd), so

- when the training ends, the leader's outcome stops the script and every process it started
  (SIGTERM, SIGKILL 10 s later: container.session) and the host exits with the job's exit
  code;
- a stop (SIGTERM: job stopped, max runtime, spot reclaim) is not passed on to the script:
  the ranks save their checkpoint at an agreed step, which may need the data this host
  serves, so the script runs on until the leader reports the job's end, as above (or, if
  that never comes, until `stop_grace` ends it);
- when the script fails, the leader hears it at once (ENDED), stops the ranks and the job fails
  with the data host's reason; a script that completes waits for the training (processes it
  left running are ended as it exits);
- a data host that vanishes is named by the leader after `heartbeat_timeout`, and a leader that
  vanishes by the data host, as for any worker.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from container import network, ports
from container.coordination import follow_leader, leaders_outcome
from container.failure import Outcome
from container.logs import log
from container.messages import Message, Verb
from container.oom import counting_from_now
from container.plan import LaunchPlan
from container.supervisor import run_supervised
from job.errors import TrainError
from job.protocol import FailureKind


def run_data_host(plan: LaunchPlan) -> Outcome:
    """Follow the leader (a thread) and run the script beside it (this thread: it takes the
    stop signals) until the leader reports the job's outcome."""
    cluster, launch = plan.cluster, plan.launch
    address = network.address_of(cluster.current_host)
    ready, ended = threading.Event(), threading.Event()
    link: dict[str, Any] = {}  # send, outcome or error, whichever the thread set

    def joined(send: Callable[[Message], bool]) -> None:
        link["send"] = send
        ready.set()

    def prepare(_key: str) -> str:
        """Joined: a port of the data service held here is this host's FAIL to the leader,
        before the training starts; `-` for a host key (no sshd)."""
        ports.check(plan, address)
        return "-"

    def follow() -> None:
        try:
            link["outcome"] = follow_leader(
                cluster.leader,
                launch.coordinator_port,
                cluster.current_host,
                address=address,
                leader_timeout=launch.leader_timeout,
                heartbeat_timeout=launch.heartbeat_timeout,
                on_key=prepare,
                on_ready=joined,
            )
        except TrainError as error:
            link["error"] = error
        finally:
            ended.set()
            ready.set()

    memory = counting_from_now()  # this host's own finding counts the job's kills only
    threading.Thread(target=follow, daemon=True, name="leader").start()
    ready.wait()
    if not ended.is_set():
        what = "the script" if plan.job.program else "the tf.data service"
        log.info(f"data host {cluster.current_host} runs {what} on its own")
        outcome = run_supervised(
            list(plan.data_command),
            grace=launch.stop_grace,
            host_of_rank=lambda _: cluster.current_host,
            env={**os.environ, **plan.data_env},
            abort=ended,
            forward_stop=False,
            memory=memory,
        )
        # A stop reaches every host: the leader stops the ranks itself, with a checkpoint.
        if outcome.exit_code and outcome.kind != FailureKind.STOPPED and not ended.is_set():
            link["send"](Message(Verb.ENDED, outcome=outcome))
    ended.wait()
    if "error" in link:
        raise link["error"]
    return leaders_outcome(link["outcome"], cluster.current_host, cluster.leader, memory)
