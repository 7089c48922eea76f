"""Two jobs on one host, or a job and something else, must not share a port the job listens on
(container.ports): JAX's coordinator listens with SO_REUSEPORT, so two jobs on port 7777 both
started and one's process registered with the other's coordinator, which aborted. A job on one
host takes free ports; a job of several hosts stops naming the port (exit 2, on every host) when
it is held on one, the leader, a worker or a data host, before anything of the job listens there.

The GPU check's two jobs at once (the case that found it) are in test_gpu_check.py."""

import contextlib
import dataclasses
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from container import ports
from container.plan import JobPort, host_ports, make_plan
from job.errors import ConfigError
from job.paths import MlPaths
from job.rank_job import RankJob
from job.sagemaker_config import InstanceGroup, JobConfig, ResourceConfig, write_job_config
from job.validated import validate_hyperparameters
from scripts.default_job import digits_channels
from scripts.digits_files import write_digits
from tests.conftest import ROOT, failure_of
from tests.container.test_instance_groups import run_all
from tests.container.test_multi_host import HOSTS
from tests.helpers import loopback_hyperparameters

ENV = {"PATH": "/venv/bin:/usr/bin"}
JAX_COORDINATOR = "JAX's coordinator for keras.distribution"
SSHD = "the job's own sshd"
TF_WORKERS = "this host's MultiWorkerMirroredStrategy workers"
DATA_GROUPS = (
    InstanceGroup("train", "ml.g5.xlarge", ("127.0.0.1",)),
    InstanceGroup("data", "ml.c5.18xlarge", ("127.0.0.2", "127.0.0.3")),
)


def script_job(root, hyperparameters=None, hosts=("algo-1",), current="algo-1"):
    paths = MlPaths(root)
    paths.code_dir.mkdir(parents=True, exist_ok=True)
    (paths.code_dir / "train.py").write_text("")
    return JobConfig(
        paths,
        ResourceConfig(current, tuple(hosts), "lo"),
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


def grouped_job(root, current, hyperparameters=None, groups=DATA_GROUPS):
    """A job of two instance groups (DATA_GROUPS: one training host, two data hosts) as host
    `current` is given it: the built-in trainer, or with `sagemaker_program` a script."""
    hosts = tuple(host for group in groups for host in group.hosts)
    group = next(group for group in groups if current in group.hosts)
    paths = MlPaths(root)
    paths.code_dir.mkdir(parents=True, exist_ok=True)
    (paths.code_dir / "train.py").write_text("")
    return JobConfig(
        paths,
        ResourceConfig(current, hosts, "lo", group.instance_type, group.name, groups),
        {"sagemaker_distribution_instance_groups": "train", **(hyperparameters or {})},
        digits_channels("images"),
    )


@contextlib.contextmanager
def held(port=0, address=None):
    """A plain listener on `port` (0: one the kernel picks) on `address`, by default every
    address, as a web server would hold it; yields the port."""
    sock = (
        socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        if address is None
        else socket.create_server((address, port))
    )
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


# --- which ports each host makes sure of (pure: container.plan.host_ports) --------------


def test_a_one_host_jobs_ports_are_its_own_to_move(tmp_path):
    assert host_ports(planned(script_job(tmp_path))) == (
        JobPort("distribution_port", 7777, 1, JAX_COORDINATOR, True),
    )
    workers = planned(script_job(tmp_path, {"processes_per_host": 2}), stack="tf")
    assert host_ports(workers)[1] == JobPort("tf_worker_port", 8890, 2, TF_WORKERS, True)


def test_ports_other_hosts_were_told_are_fixed_on_the_leader_and_on_every_worker(tmp_path):
    hosts = ("algo-1", "algo-2")
    settings = {"processes_per_host": 2, "tf_worker_port": 9000, "sshd_port": 2222}
    leader = host_ports(planned(script_job(tmp_path, settings, hosts), stack="tf"))
    assert [(p.setting, p.port, p.count, p.movable, p.own_address) for p in leader] == [
        ("distribution_port", 7777, 1, False, False),
        ("tf_worker_port", 9000, 2, False, False),
        ("sshd_port", 2222, 1, False, True),
        ("coordinator_port", 29499, 1, False, True),
    ]
    worker = host_ports(planned(script_job(tmp_path, settings, hosts, "algo-2"), "tf"))
    assert worker == (
        JobPort("tf_worker_port", 9000, 2, TF_WORKERS),
        JobPort("sshd_port", 2222, 1, SSHD, own_address=True),
    )
    horovod = host_ports(planned(script_job(tmp_path, settings, hosts, "algo-2")))
    assert horovod == (JobPort("sshd_port", 2222, 1, SSHD, own_address=True),)


def test_a_data_host_of_the_built_in_trainer_checks_its_data_service_ports(tmp_path):
    """The dispatcher on the first data host's data_service_port, a worker on the next port of
    every data host (train.data_service); a script's data host listens where its script says."""
    settings = {"data_service_port": 6100}
    first = host_ports(planned(grouped_job(tmp_path, "127.0.0.2", settings)))
    assert first == (
        JobPort("data_service_port", 6100, 2, "the tf.data service's dispatcher and worker"),
    )
    second = host_ports(planned(grouped_job(tmp_path, "127.0.0.3", settings)))
    assert second == (
        JobPort(
            "data_service_port", 6101, 1, "the tf.data service's worker (on data_service_port + 1)"
        ),
    )
    script = grouped_job(tmp_path, "127.0.0.2", {**settings, "sagemaker_program": "train.py"})
    assert host_ports(planned(script)) == ()
    leader = host_ports(planned(grouped_job(tmp_path, "127.0.0.1", settings)))
    assert [(p.setting, p.movable) for p in leader] == [
        ("distribution_port", True),  # only its own ranks: one training host
        ("coordinator_port", False),  # the data hosts were told it
    ]


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


def held_message(port, host, listener, setting):
    return (
        f"port {port} on {host}, where {listener} would listen, is held by another process on "
        f"this host (another job?); set the hyperparameter {setting} to a port that is free on "
        f"{host} (every host is given the same value)"
    )


# --- each host's check of its fixed ports (container.ports.check) -------------------------


def test_a_leader_whose_fixed_port_is_held_stops_naming_it(tmp_path):
    with held() as free:
        pass  # a port free a moment ago, for the JAX coordinator
    with held() as port:
        settings = {"processes_per_host": 2, "tf_worker_port": port, "distribution_port": free}
        the_plan = planned(script_job(tmp_path, settings, ("algo-1", "algo-2")), stack="tf")
        with pytest.raises(ConfigError) as error:
            ports.check(the_plan, "127.0.0.1")
    assert str(error.value) == held_message(port, "algo-1", TF_WORKERS, "tf_worker_port")


def test_a_worker_checks_its_tensorflow_workers_ports_on_every_address(tmp_path):
    with held() as port:
        pass  # free a moment ago: the first worker's
    with held(port + 1):  # the second worker's, held
        settings = {"processes_per_host": 2, "tf_worker_port": port, "sshd_port": port + 2}
        the_plan = planned(script_job(tmp_path, settings, ("algo-1", "algo-2"), "algo-2"), "tf")
        with pytest.raises(ConfigError) as error:
            ports.check(the_plan, "127.0.0.2")
    assert str(error.value) == held_message(port + 1, "algo-2", TF_WORKERS, "tf_worker_port")


def test_a_hosts_sshd_port_is_checked_on_its_own_address_only(tmp_path):
    """sshd listens on the host's cluster address: another host of the job on the same machine
    (the leader's sshd on 127.0.0.1) holds that port on its own address, no conflict."""
    with held(address="127.0.0.1") as port:
        the_plan = planned(script_job(tmp_path, {"sshd_port": port}, HOSTS, "127.0.0.2"))
        ports.check(the_plan, "127.0.0.2")
        with held(port, "127.0.0.2"), pytest.raises(ConfigError) as error:
            ports.check(the_plan, "127.0.0.2")
    assert str(error.value) == held_message(port, "127.0.0.2", SSHD, "sshd_port")


# --- the launcher, end to end -------------------------------------------------------------


def test_the_launcher_of_several_hosts_exits_2_when_the_jax_coordinators_port_is_held(tmp_path):
    """Before the check the leader went on to wait for its workers, then its ranks' JAX failed
    or joined another job's coordinator."""
    the_job = script_job(tmp_path, loopback_hyperparameters(timeout=1), HOSTS, HOSTS[0])
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
    assert failure_of(tmp_path).startswith(
        held_message(7777, HOSTS[0], JAX_COORDINATOR, "distribution_port")
    ), failure_of(tmp_path)
    assert "hosts ready" not in done.stdout + done.stderr  # mpirun never started


def test_a_worker_whose_sshd_port_is_held_exits_2_and_the_leader_names_it(make_script_job):
    """Held on the worker's address only, as on a machine that several hosts share: the
    leader's sshd on the same port of its own address is fine. Before, nothing checked the
    worker's port (its sshd would fail to bind while the worker reported ready all the same),
    and the leader's check, on every address, took the worker's port for its own: the leader
    stopped naming 127.0.0.1 and the worker waited `leader_timeout` for it (exit 3). The
    leader exits 2 as the worker does: it once made the worker's FAIL the cluster's (3)."""
    settings = {**loopback_hyperparameters(timeout=30), "processes_per_host": 1}
    sshd = settings["sshd_port"]
    roots = {
        host: make_script_job("train.py", settings, "", hosts=HOSTS, current=host) for host in HOSTS
    }
    with held(sshd, HOSTS[1]):
        ended = run_all(roots, timeout=60)
    codes = {host: code for host, (code, _) in ended.items()}
    assert codes == {HOSTS[0]: 2, HOSTS[1]: 2}, (
        ended[HOSTS[0]][1][-2000:] + ended[HOSTS[1]][1][-2000:]
    )
    reason = held_message(sshd, HOSTS[1], SSHD, "sshd_port")
    assert failure_of(roots[HOSTS[1]]).startswith(reason), failure_of(roots[HOSTS[1]])
    leaders = failure_of(roots[HOSTS[0]])
    assert leaders.startswith(f"worker {HOSTS[1]} could not get ready: {reason}"), leaders
    assert "hosts ready" not in ended[HOSTS[0]][1]  # mpirun never started


def test_a_data_host_whose_data_service_port_is_held_exits_2_and_the_leader_names_it(tmp_path):
    """Before, the data host's tf.data service failed to start beside a training that had
    begun (or joined another job's dispatcher, had that one listened with SO_REUSEPORT)."""
    groups = (DATA_GROUPS[0], InstanceGroup("data", "ml.c5.18xlarge", (HOSTS[1],)))
    settings = loopback_hyperparameters(timeout=30, more_ports=("data_service_port",))
    data_service = settings["data_service_port"]
    roots = {}
    for host in HOSTS:
        the_job = grouped_job(tmp_path / host, host, settings, groups)
        write_job_config(the_job)
        roots[host] = the_job.paths.root
    write_digits(tmp_path / "data", "images")  # the training channel, whole on every host
    for root in roots.values():
        shutil.copytree(tmp_path / "data", MlPaths(root).data_dir, dirs_exist_ok=True)
    with held(data_service):
        ended = run_all(roots, timeout=60)
    codes = {host: code for host, (code, _) in ended.items()}
    assert codes == {HOSTS[0]: 2, HOSTS[1]: 2}, (
        ended[HOSTS[0]][1][-2000:] + ended[HOSTS[1]][1][-2000:]
    )
    reason = held_message(
        data_service, HOSTS[1], "the tf.data service's dispatcher and worker", "data_service_port"
    )
    assert failure_of(roots[HOSTS[1]]).startswith(reason), failure_of(roots[HOSTS[1]])
    leaders = failure_of(roots[HOSTS[0]])
    assert leaders.startswith(f"worker {HOSTS[1]} could not get ready: {reason}"), leaders
    assert "hosts ready" not in ended[HOSTS[0]][1]  # mpirun never started
