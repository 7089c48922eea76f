"""`train`: the SageMaker training entry point of this image.

    train [--ml-root DIR] [--dry-run]

What it does, on every host of the job:
1. Reads <ml-root>/input/config (resourceconfig, hyperparameters, inputdataconfig) into typed,
   validated config. Any mistake stops the job here, before a single process starts, with a
   message in <ml-root>/output/failure that says what to change.
2. Plans the cluster: hosts sorted, leader = the first, ranks per host = the
   `processes_per_host` hyperparameter, else one per GPU, else one; the per-device batch,
   accumulation steps and scaled learning rate; the exact mpirun argv. `--dry-run` prints
   this plan as JSON and exits.
3. One host: runs mpirun locally; no sshd, no ssh.
   Several hosts: every host resolves every host name (retrying until `host_timeout`).
   The leader makes a fresh ssh key for the job, starts its own sshd and a coordinator on
   `coordinator_port`; each worker connects there, receives the key, starts its sshd and
   reports ready with its host key (container.coordination: any start order, heartbeats both
   ways, only the cluster's own addresses heard). The leader waits for every worker (naming
   any that never came), checks every sshd answers, then runs mpirun across the hosts. Each
   host first makes sure that nothing else holds a port it will listen on (container.ports):
   a held one fails the job, naming it, before anything starts.
   Workers hold until the leader reports the outcome, and exit with it within a second or
   two; a worker whose leader never answers or goes silent exits 3 naming the leader.
4. Ranks run `python -P -m mpi4py -m train.rank_main` (the built-in Horovod/Keras trainer) or,
   in script mode (`sagemaker_program` / SAGEMAKER_PROGRAM), the user's script from
   <ml-root>/code with the SM_* environment and the hyperparameters as arguments. An image
   built with SCRIPT_MODE=off runs only the built-in trainer and refuses script mode
   (job.validated.BUILTIN_ONLY_MARKER).
5. Failure: any rank failing stops all ranks (it exits at once, train.rank.run_rank, and
   OpenMPI's orte_abort_on_non_zero_status stops the others) and every host exits with the same code, decided by the kind
   of failure (job.protocol.exit_code: 2 configuration or data, 3 cluster, 143 stopped,
   else the rank's own). <ml-root>/output/failure starts with the root cause on every host:
   the failing host, rank and that rank's error.
6. SIGTERM: forwarded to the ranks, which save a checkpoint and stop; see
   container.supervisor. Exit code 0 = Completed, anything else = Failed. A script-mode
   job that completes with an empty model folder is warned about, on the leader, in the log
   and in <ml-root>/output/data (container.empty_model).
7. No progress for `progress_timeout` seconds: every rank's stack to the log, the job stops
   and fails as hung (exit code 4) on every host; see container.watchdog.
8. With `max_restarts`, a failed rank or a hung job runs every rank again from the newest
   checkpoint (the leader decides; container.restarts).
9. With MLFLOW_TRACKING_URI, the leader makes the job's MLflow run before the ranks start and
   ends it with the outcome (container.mlflow_run); every rank is told the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from container import empty_model, mlflow_run, network, ports, source_dir, sshd
from container.coordination import Leader, follow_leader, leaders_outcome
from container.data_host import run_data_host
from container.failure import Outcome, write_failure
from container.init import become_init
from container.logs import log
from container.oom import CgroupMemory, counting_from_now
from container.plan import LaunchPlan, make_plan
from container.restarts import run_with_restarts
from container.session import adopt_orphans, end_descendants
from container.supervisor import run_supervised
from container.watchdog import ProgressWatch
from job.errors import TrainError
from job.launch_config import LaunchConfig
from job.paths import DEFAULT_ML_ROOT, MlPaths
from job.protocol import FailureKind, Mark, mark_line
from job.sagemaker_config import JobConfig, read_job_config
from job.validated import BUILTIN_ONLY_MARKER, HOROVOD, TENSORFLOW, validate_hyperparameters


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    become_init()
    return launch(MlPaths(args.ml_root), dry_run=args.dry_run)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="train", description="Train on SageMaker with Horovod over OpenMPI."
    )
    parser.add_argument(
        "--ml-root",
        type=Path,
        default=DEFAULT_ML_ROOT,
        help="the SageMaker tree to use instead of /opt/ml (local runs, tests)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the launch plan as JSON and exit without starting anything",
    )
    return parser.parse_args(argv)


def count_gpus() -> int:
    """GPUs this host can use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if not shutil.which("nvidia-smi"):
        return 0
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())


def installed_stack() -> str:
    """Which stack this image holds: Horovod's, or TensorFlow 2.21's (no Horovod)."""
    return HOROVOD if importlib.util.find_spec("horovod") else TENSORFLOW


def launch(paths: MlPaths, *, dry_run: bool = False) -> int:
    """The one top-level handler: every failure becomes the failure file and an exit code."""
    runtime = Path(tempfile.mkdtemp(prefix="train-job-"))  # private (0700), never reused
    run = None  # the job's MLflow run, when it has a tracking server
    try:
        job = read_job_config(paths)
        paths = job.paths  # with the checkpoint and TensorBoard folders the job configured
        settings = validate_hyperparameters(
            job.hyperparameters,
            os.environ,
            job.source_code,
            builtin_only=BUILTIN_ONLY_MARKER.exists(),
        )
        source_dir.prepare(job, settings, os.environ)
        job = with_usable_interface(job, settings.launch.host_timeout, dry_run)
        gpu_count = count_gpus()

        def plan_with(launch: LaunchConfig) -> LaunchPlan:
            return make_plan(
                job,
                dataclasses.replace(settings, launch=launch),
                gpu_count=gpu_count,
                python=sys.executable,
                runtime=runtime,
                environ=os.environ,
                stack=installed_stack(),
            )

        plan = plan_with(settings.launch)
        if dry_run:
            print(json.dumps(plan.as_json(), indent=2))
            return 0
        launch_settings = ports.secure(plan)  # a one-host job's own ports: free ones
        if launch_settings != plan.launch:
            plan = plan_with(launch_settings)
        log_plan(plan)
        run, run_env, secret_env = mlflow_run.begin(
            plan, job.hyperparameters, os.environ, installed_stack(), paths
        )
        os.environ.update(secret_env)  # mpirun's environment: its ranks', not its command's
        plan = dataclasses.replace(
            plan, command=plan.command.started(run_env, secrets=tuple(secret_env))
        )
        started = time.time()
        outcome = execute(plan, runtime, paths)
        if outcome.exit_code == 0 and plan.job.program and plan.cluster.is_leader:
            empty_model.warn_if_empty(paths, since=started)
    except TrainError as error:
        outcome = Outcome.failed(error.kind, str(error))
    except Exception as error:  # a bug here, not the user's: say so, with the traceback in the log
        traceback.print_exc()
        outcome = Outcome.failed(
            FailureKind.INTERNAL, f"internal error in the launcher: {type(error).__name__}: {error}"
        )
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    mlflow_run.end(run, outcome)
    return report(paths, outcome, dry_run)


def with_usable_interface(job: JobConfig, host_timeout: float, dry_run: bool) -> JobConfig:
    """The job with an interface this host has: resourceconfig.json's when it is here, else
    the one carrying this host's cluster address (logged). Only a cluster needs one; a dry
    run does not wait for its host name to resolve."""
    resources = job.resources
    named, host = resources.network_interface_name, resources.current_host
    if len(resources.hosts) == 1:
        return job
    interfaces = network.local_interfaces()
    if named in interfaces:
        return job
    if not dry_run:
        network.wait_resolvable([host], resources.hosts[0], host_timeout)
    elif not network.resolves(host):
        return job
    address = network.address_of(host)
    chosen = network.interface_for(named, address, interfaces)
    if chosen is None:
        log.info(
            f"network interface {named} (resourceconfig.json) is not on this host "
            f"and none carries {host}'s address {address} ("
            f"{', '.join(f'{name} {value}' for name, value in interfaces.items())}); "
            f"keeping {named}"
        )
        return job
    log.info(
        f"network interface {named} (resourceconfig.json) is not on this host; "
        f"using {chosen}, which carries {host}'s address {address}"
    )
    return dataclasses.replace(
        job, resources=dataclasses.replace(resources, network_interface_name=chosen)
    )


def report(paths: MlPaths, outcome: Outcome, dry_run: bool) -> int:
    if outcome.exit_code == 0:
        log.info("job completed")
        print(mark_line(Mark.JOB_DONE), flush=True)
        return 0
    log.error(f"job FAILED (exit code {outcome.exit_code}): {outcome.reason}")
    if not dry_run:
        write_failure(paths, outcome.reason)
    return outcome.exit_code


def log_plan(plan: LaunchPlan) -> None:
    cluster = plan.cluster
    role = "leader" if cluster.is_leader else "data host" if cluster.is_data_host else "worker"
    log.info(
        f"host {cluster.current_host} ({role}) of {len(cluster.hosts)}: "
        f"{', '.join(cluster.hosts)}; {cluster.processes_per_host} rank(s) per host, "
        f"world size {cluster.world_size}"
    )
    if cluster.data_hosts:
        log.info(
            f"data hosts (other instance groups, the script on its own): "
            f"{', '.join(cluster.data_hosts)}"
        )
    if plan.ignored_hyperparameters:
        log.info(f"ignoring SDK hyperparameters: {', '.join(plan.ignored_hyperparameters)}")
    if plan.batches:
        log.info(plan.batches.derivation())
    if cluster.is_leader:
        log.info(f"running: {shlex.join(plan.mpirun)}")
    elif cluster.is_data_host:
        log.info(f"running: {shlex.join(plan.data_command)}")


def supervise(
    plan: LaunchPlan,
    paths: MlPaths,
    root_cause: Callable[[Outcome], Outcome] = lambda outcome: outcome,
    abort: threading.Event | None = None,
    memory_of: Callable[[str], CgroupMemory | None] = lambda host: None,
    start_attempt: Callable[[], None] = lambda: None,
) -> Outcome:
    """Run the plan's mpirun under the stop signals and the progress watchdog, again after a
    failure while `max_restarts` allows (container.restarts); `root_cause` names what made
    an attempt fail (on the leader of several hosts: a lost worker or a data host's failure,
    which also sets `abort`); `memory_of` asks a worker host what its memory cgroup counted
    since `start_attempt` ran, which each attempt runs first (the leader's coordinator:
    whether a rank killed there was out of memory). This host's cgroup is read as each
    attempt starts too: an earlier attempt's OOM kill proves nothing about a later SIGKILL."""
    cluster = plan.cluster

    def attempt() -> Outcome:
        start_attempt()
        memory = counting_from_now()
        watch = ProgressWatch.of(
            plan.launch,
            bool(plan.job.program),
            cluster.host_of_rank,
            cluster.world_size,
            plan.stall_check,
        )
        return root_cause(
            run_supervised(
                list(plan.mpirun),
                grace=plan.launch.stop_grace,
                host_of_rank=cluster.host_of_rank,
                watch=watch,
                abort=abort,
                checkpoint_dir=paths.checkpoint_dir,
                memory=memory,
                memory_of=memory_of,
            )
        )

    return run_with_restarts(
        attempt, plan.launch.max_restarts, paths.checkpoint_dir, paths.output_data_dir
    )


def execute(plan: LaunchPlan, runtime: Path, paths: MlPaths) -> Outcome:
    cluster = plan.cluster
    if not cluster.multi_host and not cluster.data_hosts:
        return supervise(plan, paths)
    network.wait_resolvable(
        [*cluster.hosts, *cluster.data_hosts], cluster.leader, plan.launch.host_timeout
    )
    if cluster.is_data_host:
        return run_data_host(plan)
    files = sshd.make_runtime(runtime)
    return run_leader(plan, files, paths) if cluster.is_leader else run_worker(plan, files)


def run_leader(plan: LaunchPlan, files: sshd.SshFiles, paths: MlPaths) -> Outcome:
    cluster, launch = plan.cluster, plan.launch
    public_key = sshd.make_client_key(files)
    address = network.address_of(cluster.current_host)
    ports.check(plan, address)  # before anything of the job listens here
    coordinator = Leader(
        address=address,
        port=launch.coordinator_port,
        workers=list(cluster.workers),
        public_key=public_key,
        heartbeat_timeout=launch.heartbeat_timeout,
        data_hosts=cluster.data_hosts,
    )
    own_sshd = None
    try:
        if cluster.multi_host:  # ranks on other hosts: mpirun reaches them over ssh
            own_sshd, own_host_key = sshd.start_sshd(
                files, address=address, port=launch.sshd_port, authorized_key=public_key
            )
        host_keys = coordinator.wait_ready(launch.host_timeout)
        if cluster.multi_host:
            host_keys[cluster.current_host] = own_host_key
            files.known_hosts.write_text(
                "".join(
                    sshd.known_hosts_line(host, launch.sshd_port, key)
                    for host, key in host_keys.items()
                )
            )
            addresses = {**coordinator.addresses, cluster.current_host: address}
            files.client_config.write_text(
                sshd.client_config({host: addresses[host] for host in host_keys}, launch.sshd_port)
            )
            network.wait_sshd(cluster.hosts, launch.sshd_port, launch.host_timeout)
        hosts = len(cluster.hosts) + len(cluster.data_hosts)
        log.info(f"all {hosts} hosts ready")
        print(mark_line(Mark.HOSTS_READY), flush=True)
        outcome = supervise(
            plan,
            paths,
            coordinator.root_cause,
            coordinator.abort,
            coordinator.memory_of,
            coordinator.start_attempt,
        )
    except TrainError as error:
        coordinator.finish(Outcome.failed(error.kind, str(error)))
        raise
    finally:
        sshd.stop(own_sshd)
    coordinator.finish(outcome)
    return outcome


def run_worker(plan: LaunchPlan, files: sshd.SshFiles) -> Outcome:
    """Serve the leader's mpirun over sshd until the leader reports the job's outcome."""
    cluster, launch = plan.cluster, plan.launch
    address = network.address_of(cluster.current_host)
    started: list[subprocess.Popen[bytes]] = []

    def prepare(public_key: str) -> str:
        ports.check(plan, address)  # an error here is this host's FAIL to the leader
        process, host_key = sshd.start_sshd(
            files, address=address, port=launch.sshd_port, authorized_key=public_key
        )
        started.append(process)
        return host_key

    # The leader stops the job on SIGTERM; this host must keep its ranks alive meanwhile.
    previous = signal.signal(
        signal.SIGTERM,
        lambda *_: log.info("SIGTERM received; the leader is stopping the job"),
    )
    adopt_orphans()  # what a rank leaves here outlives the MPI daemon that started it
    memory = counting_from_now()  # this host's own finding counts the job's kills only
    try:
        outcome = follow_leader(
            cluster.leader,
            launch.coordinator_port,
            cluster.current_host,
            address=address,
            leader_timeout=launch.leader_timeout,
            heartbeat_timeout=launch.heartbeat_timeout,
            on_key=prepare,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
        for process in started:
            sshd.stop(process)
        end_descendants("every process the job left on this host", "the job has ended")
    return leaders_outcome(outcome, cluster.current_host, cluster.leader, memory)


if __name__ == "__main__":
    sys.exit(main())
