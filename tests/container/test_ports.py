"""Two jobs on one host, or a job and something else, must not share a port the job listens on
(container.ports): JAX's coordinator listens with SO_REUSEPORT, so two jobs on port 7777 both
started and one's process registered with the other's coordinator, which aborted. A job on one
host takes free ports; a job of several hosts stops at once naming the port (exit 2).

The GPU check's two jobs at once (the case that found it) are in test_gpu_check.py."""

import contextlib
import dataclasses
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from container import ports
from container.plan import JobPort, leader_ports, make_plan
from job.errors import ConfigError
from job.paths import MlPaths
from job.rank_job import RankJob
from job.sagemaker_config import JobConfig, ResourceConfig, write_job_config
from job.validated import validate_hyperparameters
from tests.conftest import ROOT

ENV = {"PATH": "/venv/bin:/usr/bin"}
JAX_COORDINATOR = "JAX's coordinator for keras.distribution"


def script_job(root, hyperparameters=None, hosts=("algo-1",), current="algo-1", groups=()):
    paths = MlPaths(root)
    paths.code_dir.mkdir(parents=True, exist_ok=True)
    (paths.code_dir / "train.py").write_text("")
    return JobConfig(
        paths,
        ResourceConfig(current, tuple(hosts), "lo", groups=groups),
        {"sagemaker_program": "train.py", **(hyperparameters or {})},
        {},
    )


def planned(the_job, stack="horovod"):
    return make_plan(
        the_job,
        validate_hyperparameters(the_job.hyperparameters, ENV),
        gpu_count=0,
        python=sys.executable,
        runtime=Path("/run/job"),
        environ=ENV,
        stack=stack,
    )


@contextlib.contextmanager
def held(port=0):
    """A plain listener on `port` (0: one the kernel picks) on every address, as a web server
    would hold it; yields the port."""
    sock = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


# --- which ports the leader makes sure of (pure: container.plan.leader_ports) -------------


def test_a_one_host_jobs_ports_are_its_own_to_move(tmp_path):
    assert leader_ports(planned(script_job(tmp_path))) == (
        JobPort("distribution_port", 7777, 1, JAX_COORDINATOR, True),
    )
    workers = planned(script_job(tmp_path, {"processes_per_host": 2}), stack="tf")
    assert leader_ports(workers)[1] == JobPort(
        "tf_worker_port",
        8890,
        2,
        "this host's MultiWorkerMirroredStrategy workers",
        True,
    )


def test_ports_other_hosts_were_told_are_fixed_and_only_the_leader_checks(tmp_path):
    hosts = ("algo-1", "algo-2")
    settings = {"processes_per_host": 2, "tf_worker_port": 9000, "sshd_port": 2222}
    leader = leader_ports(planned(script_job(tmp_path, settings, hosts), stack="tf"))
    assert [(p.setting, p.port, p.count, p.movable) for p in leader] == [
        ("distribution_port", 7777, 1, False),
        ("tf_worker_port", 9000, 2, False),
        ("sshd_port", 2222, 1, False),
        ("coordinator_port", 29499, 1, False),
    ]
    assert leader_ports(planned(script_job(tmp_path, settings, hosts, "algo-2"), "tf")) == ()


# --- the leader's check (container.ports.secure) ------------------------------------------


def test_a_one_host_job_takes_free_ports_every_time_and_its_plan_says_them(tmp_path):
    """Even when the configured port is free: another job started at the same moment may be
    about to bind it (its ranks still importing)."""
    the_job = script_job(tmp_path, {"processes_per_host": 3})
    the_plan = planned(the_job, stack="tf")
    with held(7777) if ports.is_free(7777) else contextlib.nullcontext():
        launch = ports.secure(the_plan)
    assert launch.distribution_port != 7777 and launch.tf_worker_port != 8890
    taken = {launch.distribution_port, *range(launch.tf_worker_port, launch.tf_worker_port + 3)}
    assert len(taken) == 4 and all(ports.is_free(port) for port in taken)
    settings = validate_hyperparameters(the_job.hyperparameters, ENV)
    again = make_plan(
        the_job,
        dataclasses.replace(settings, launch=launch),
        gpu_count=0,
        python=sys.executable,
        runtime=Path("/run/job"),
        environ=ENV,
        stack="tf",
    )
    carried = next(a for a in again.mpirun if a.startswith("TRAIN_JOB="))
    rank_job = RankJob.from_json(carried.split("=", 1)[1])
    assert rank_job.processes.coordinator == f"localhost:{launch.distribution_port}"
    assert rank_job.tf_workers == tuple(
        f"localhost:{launch.tf_worker_port + local}" for local in range(3)
    )


def test_a_port_held_by_a_grpc_style_listener_counts_as_held():
    """JAX's server listens with SO_REUSEPORT, which would let another such socket bind beside
    it: the check binds without it, so that server holds the port for the check."""
    with contextlib.closing(socket.socket(socket.AF_INET6)) as grpc:
        grpc.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        grpc.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        grpc.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        grpc.bind(("::", 0))
        grpc.listen()
        port = grpc.getsockname()[1]
        assert not ports.is_free(port)
    assert ports.is_free(port)


def test_a_leader_whose_fixed_port_is_held_stops_naming_it(tmp_path):
    with held() as free:
        pass  # a port free a moment ago, for the JAX coordinator
    with held() as port:
        settings = {"processes_per_host": 2, "tf_worker_port": port, "distribution_port": free}
        the_plan = planned(script_job(tmp_path, settings, ("algo-1", "algo-2")), stack="tf")
        with pytest.raises(ConfigError) as error:
            ports.secure(the_plan)
    assert str(error.value) == (
        f"port {port} on algo-1, where this host's MultiWorkerMirroredStrategy workers would "
        "listen, is held by another process on this host (another job?); set the "
        "hyperparameter tf_worker_port to a port that is free on algo-1 (every host is given "
        "the same value)"
    )


# --- the launcher, end to end -------------------------------------------------------------


def test_the_launcher_of_several_hosts_exits_2_when_the_jax_coordinators_port_is_held(tmp_path):
    """Before the check the leader went on to wait for its workers (here: exit 3 once algo-2
    never resolved), then its ranks' JAX failed or joined another job's coordinator."""
    with held() as sshd, held() as coordinator:
        pass  # two ports free a moment ago, for the sshd and coordinator nothing here starts
    the_job = script_job(
        tmp_path,
        {"sshd_port": sshd, "coordinator_port": coordinator, "host_timeout": 1},
        ("algo-1", "algo-2"),
    )
    write_job_config(the_job)
    with held(7777) if ports.is_free(7777) else contextlib.nullcontext():
        done = subprocess.run(
            [sys.executable, "-m", "container.train_cli", "--ml-root", str(tmp_path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure.startswith(
        f"port 7777 on algo-1, where {JAX_COORDINATOR} would listen, is held by another "
        "process on this host (another job?); set the hyperparameter distribution_port"
    ), failure
    assert "mpirun" not in done.stdout + done.stderr
