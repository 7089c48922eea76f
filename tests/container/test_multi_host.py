"""Two hosts on one machine: 127.0.0.1 (leader) and 127.0.0.2 (worker), each with its own
launcher, its own SageMaker tree and its own sshd. mpirun really crosses over ssh to the
second address (OpenMPI treats it as a remote node), so the leader/worker protocol, the job
key, strict host-key checking and the failure paths all run for real. What separate
containers prove as well is proven there only (tests/image): either start order
(test_fault_matrix's staggered start), the built-in trainer across hosts (test_local_cluster)
and a data error in a rank (test_fault_matrix)."""

import json
import os
import re
import subprocess
import time

import psutil
import pytest

from tests.conftest import TRAIN, failure_of
from tests.helpers import loopback_hyperparameters
from tests.waiting import eventually

HOSTS = ["127.0.0.1", "127.0.0.2"]

# The job's environment as SageMaker gives it to every container (Estimator(environment=...),
# the region), and what it gives each instance of its own: the endpoint of the job role's
# credentials for this instance, the container's metadata endpoint.
JOB_ENV = {"USER_SETTING": "on every host", "AWS_REGION": "eu-west-1"}
HOST_ENV = {
    host: {
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": f"/v2/credentials/role-of-{host}",
        "ECS_CONTAINER_METADATA_URI_V4": f"http://169.254.170.2/v4/task-of-{host}",
    }
    for host in HOSTS
}
NAMES = sorted([*JOB_ENV, *HOST_ENV[HOSTS[0]]])

PROBE = (
    f"NAMES = {NAMES!r}\n"
    + """
import json, os, socket
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum).numpy().tolist()
out = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"rank{hvd.rank()}.json")
json.dump({"host": os.environ["SM_CURRENT_HOST"], "ssh": os.environ.get("SSH_CONNECTION"),
           "sum": total, "cwd": os.getcwd(),
           "env": {name: os.environ.get(name) for name in NAMES}}, open(out, "w"))
"""
)


@pytest.fixture
def cluster(make_job, make_script_job):
    def make(hyperparameters, program=None, source=None):
        values = {**loopback_hyperparameters(), "processes_per_host": 1, **hyperparameters}
        return {
            host: make_script_job(program, values, source, hosts=HOSTS, current=host)
            if program
            else make_job(values, hosts=HOSTS, current=host)
            for host in HOSTS
        }

    return make


def start(root, env=None, cwd=None):
    return subprocess.Popen(
        [str(TRAIN), "--ml-root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def runtime_of(launcher_pid):
    """The job's private runtime folder (tempfile.mkdtemp), from mpirun's ssh arguments."""
    for process in psutil.Process(launcher_pid).children(recursive=True):
        found = re.search(r"/train-job-[^/\s]+/", " ".join(process.cmdline()))
        if found:
            return found.group(0)
    raise AssertionError("no process of the launcher names its runtime folder")


def test_a_job_crosses_hosts_over_ssh(cluster):
    roots = cluster({}, "probe.py", PROBE)
    worker = start(roots["127.0.0.2"], {**JOB_ENV, **HOST_ENV["127.0.0.2"]})
    leader = start(roots["127.0.0.1"], {**JOB_ENV, **HOST_ENV["127.0.0.1"]})
    leader_output = leader.communicate(timeout=240)[0]
    worker_output = worker.communicate(timeout=30)[0]
    assert leader.returncode == 0, leader_output[-3000:]
    assert worker.returncode == 0, worker_output[-3000:]
    assert "launcher: all 2 hosts ready" in leader_output
    assert "the leader 127.0.0.1 reports exit code 0" in worker_output
    data = roots["127.0.0.1"] / "output" / "data"  # ranks write where TRAIN_ML_ROOT points
    ranks = [json.loads((data / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["host"] for r in ranks] == HOSTS
    assert ranks[0]["ssh"] is None and ranks[1]["ssh"] is not None  # rank 1 came over ssh
    assert ranks[0]["sum"] == ranks[1]["sum"] == [3.0]
    for rank, host in zip(ranks, HOSTS):  # the job's on every host, each host's own
        assert rank["env"] == {**JOB_ENV, **HOST_ENV[host]}
    assert ranks[1]["cwd"] == str(roots["127.0.0.1"] / "code")
    assert "on every host" not in leader_output  # forwarded by name, never logged
    assert "/v2/credentials/" not in leader_output + worker_output


def test_a_failing_rank_on_the_worker_fails_every_host(cluster):
    roots = cluster(
        {},
        "fail.py",
        "from mpi4py import MPI\nMPI.COMM_WORLD.barrier()\n"
        "if MPI.COMM_WORLD.rank == 1:\n    raise MemoryError('batch too large for this GPU')\n"
        "MPI.COMM_WORLD.barrier()\n",
    )
    worker, leader = start(roots["127.0.0.2"]), start(roots["127.0.0.1"])
    leader.communicate(timeout=120)
    worker.communicate(timeout=30)
    assert leader.returncode == worker.returncode == 1
    expected = "rank 1 on host 127.0.0.2 failed (exit code 1): MemoryError: batch too large"
    assert failure_of(roots["127.0.0.1"]).startswith(expected)
    assert failure_of(roots["127.0.0.2"]).startswith(expected)  # the root cause first, then
    assert failure_of(roots["127.0.0.2"]).endswith(  # who reported it
        "(reported to 127.0.0.2 by the leader 127.0.0.1)"
    )


def test_a_worker_host_that_dies_is_named_by_the_leader(cluster):
    roots = cluster(
        {},
        "hang.py",
        "import time\nfrom mpi4py import MPI\nMPI.COMM_WORLD.barrier()\n"
        "open(__import__('os').environ['SM_OUTPUT_DATA_DIR'] + f'/up{MPI.COMM_WORLD.rank}', 'w')\n"
        "MPI.COMM_WORLD.barrier()\ntime.sleep(600)\n",
    )
    worker, leader = start(roots["127.0.0.2"]), start(roots["127.0.0.1"])
    marker = roots["127.0.0.1"] / "output" / "data" / "up1"
    eventually(marker.exists, "ranks never started", 120)
    # The host dies: its launcher, its sshd, and the MPI daemon (orted daemonizes, so it is
    # found by the job key in its command line) with the rank it started.
    doomed = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
    runtime = runtime_of(leader.pid)
    for process in psutil.process_iter(["cmdline"]):
        if "orted" in (process.info["cmdline"] or [""])[0] and runtime in " ".join(
            process.info["cmdline"]
        ):
            doomed += [process, *process.children(recursive=True)]
    assert any("orted" in p.name() for p in doomed)
    for process in doomed:
        process.kill()
    started = time.monotonic()
    leader.communicate(timeout=90)
    print(f"leader exited {time.monotonic() - started:.1f} s after the worker died")
    assert leader.returncode == 3  # a host lost is a cluster failure
    assert "127.0.0.2" in failure_of(roots["127.0.0.1"]), failure_of(roots["127.0.0.1"])


def test_a_worker_whose_leader_never_comes_exits_naming_it(cluster):
    roots = cluster({"leader_timeout": 3})
    worker = start(roots["127.0.0.2"])
    output = worker.communicate(timeout=60)[0]
    assert worker.returncode == 3, output
    assert "the leader 127.0.0.1 never answered on port" in failure_of(roots["127.0.0.2"])


def test_a_leader_whose_worker_never_comes_names_it(cluster):
    roots = cluster({"host_timeout": 3})
    leader = start(roots["127.0.0.1"])
    output = leader.communicate(timeout=60)[0]
    assert leader.returncode == 3, output
    assert "never reported ready within 3 s: 127.0.0.2" in failure_of(roots["127.0.0.1"])
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(roots["127.0.0.1"]) in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()
    ]


def with_interface(roots, name):
    for root in roots.values():
        path = root / "input" / "config" / "resourceconfig.json"
        path.write_text(
            json.dumps({**json.loads(path.read_text()), "network_interface_name": name})
        )
    return roots


def test_an_interface_the_host_lacks_gives_way_to_the_one_carrying_its_address(cluster):
    """SageMaker's local mode writes `ethwe`; OpenMPI failed on it in 3 s before."""
    roots = with_interface(cluster({}, "probe.py", PROBE), "ethwe")
    worker, leader = start(roots["127.0.0.2"]), start(roots["127.0.0.1"])
    leader_output = leader.communicate(timeout=240)[0]
    worker.communicate(timeout=30)
    assert leader.returncode == worker.returncode == 0, leader_output[-3000:]
    assert (
        "launcher: network interface ethwe (resourceconfig.json) is not on this host; "
        "using lo, which carries 127.0.0.1's address 127.0.0.1"
    ) in leader_output
    assert "btl_tcp_if_include lo -mca oob_tcp_if_include lo" in leader_output
    assert (roots["127.0.0.1"] / "output" / "data" / "rank1.json").exists()


def test_openmpis_own_error_is_the_failure_reason(cluster):
    roots = cluster(
        {"mpi_options": "-mca btl_tcp_if_include nosuch0 -mca oob_tcp_if_include nosuch0"},
        "probe.py",
        PROBE,
    )
    worker, leader = start(roots["127.0.0.2"]), start(roots["127.0.0.1"])
    leader_output = leader.communicate(timeout=120)[0]
    worker.communicate(timeout=30)
    assert leader.returncode == worker.returncode == 1, leader_output[-3000:]
    assert failure_of(roots["127.0.0.1"]) == (
        "mpirun exited with code 1: OpenMPI says: None of the TCP networks specified to be "
        "included for out-of-band communications could be found: Value given: nosuch0 Please "
        "revise the specification and try again."
    )
