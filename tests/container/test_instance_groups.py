"""Heterogeneous clusters (resourceconfig.json's instance groups) on real launchers over
loopback: ranks only on the training group's hosts, the other group's host running the script
on its own for as long as the training runs, and every way that ends (the training's end, the
data host's script failing, the data host vanishing), plus the configurations refused before
anything starts."""

from __future__ import annotations

import json
import signal
import time

import pytest

from job.paths import MlPaths
from job.sagemaker_config import InstanceGroup, JobConfig, ResourceConfig, write_job_config
from scripts.default_job import digits_channels
from scripts.digits_files import write_digits
from tests.conftest import failure_of, kill_host, run_train
from tests.container.test_multi_host import start
from tests.container.test_session import running
from tests.helpers import loopback_hyperparameters

TRAIN_HOSTS, DATA_HOSTS = ("127.0.0.1", "127.0.0.2"), ("127.0.0.3",)
GROUPS = (
    InstanceGroup("train", "ml.p4d.24xlarge", TRAIN_HOSTS),
    InstanceGroup("data", "ml.c5.18xlarge", DATA_HOSTS),
)
ONE_TRAINING_HOST = (InstanceGroup("train", "ml.g5.xlarge", ("127.0.0.1",)), GROUPS[1])
PROBE = """
import json, os, sys, time
info = {name: os.environ.get(name) for name in (
    "SM_CURRENT_HOST", "SM_CURRENT_INSTANCE_GROUP", "SM_CURRENT_INSTANCE_TYPE", "SM_IS_HETERO",
    "SM_DISTRIBUTION_INSTANCE_GROUPS", "SM_HOSTS", "SM_CURRENT_INSTANCE_GROUP_HOSTS",
    "SM_INSTANCE_GROUPS", "OMPI_COMM_WORLD_SIZE", "KERAS_DISTRIBUTION_NUM_PROCESSES")}
name = f"{info['SM_CURRENT_HOST']}-{os.environ.get('OMPI_COMM_WORLD_RANK', 'alone')}.json"
if info["SM_CURRENT_INSTANCE_GROUP"] == "train":
    from mpi4py import MPI
    info["sum"] = MPI.COMM_WORLD.allreduce(1)
    time.sleep(float(sys.argv[sys.argv.index("--train-seconds") + 1]))
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], name), "w") as out:
    json.dump(info, out)
if info["SM_CURRENT_INSTANCE_GROUP"] == "data":
    if "--data-fails" in sys.argv:
        raise ValueError("the decoder crashed")
    if "--data-helper" in sys.argv:  # a helper that holds our stdout for a minute
        import subprocess
        subprocess.Popen([sys.executable, "-c", "import os, sys, time\\n"
                          "open(sys.argv[1], 'w').write(str(os.getpid()))\\ntime.sleep(60)",
                          os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "helper.pid")])
    time.sleep(600)  # a data server: the end of the training stops it
"""


@pytest.fixture
def hetero(tmp_path):
    """hetero(hyperparameters, groups=GROUPS, source=PROBE) -> {host: ml root}: a script-mode
    job of two instance groups running probe.py (`source`), as SageMaker lays it out on each
    host."""

    def make(
        hyperparameters: dict, groups=GROUPS, program="probe.py", data=None, source=PROBE
    ) -> dict:
        values = {
            **loopback_hyperparameters(more_ports=("data_service_port",)),
            "processes_per_host": 1,
            **({"sagemaker_program": program} if program else {}),
            **hyperparameters,
        }
        hosts = tuple(host for group in groups for host in group.hosts)
        roots = {}
        for group in groups:
            for host in group.hosts:
                paths = MlPaths(tmp_path / host)
                write_job_config(
                    JobConfig(
                        paths,
                        ResourceConfig(host, hosts, "lo", group.instance_type, group.name, groups),
                        values,
                        digits_channels(data) if data else {},
                    )
                )
                if data:
                    write_digits(paths.data_dir, data)
                (paths.code_dir).mkdir(parents=True)
                (paths.code_dir / "probe.py").write_text(source)
                roots[host] = paths.root
        return roots

    return make


def run_all(roots: dict, timeout: float = 180) -> dict[str, tuple[int, str]]:
    """Start every host's launcher (the data host first, the leader last); each one's exit
    code and output."""
    launchers = {host: start(root) for host, root in reversed(roots.items())}
    return {
        host: (launcher.communicate(timeout=timeout)[0], launcher.returncode)[::-1]
        for host, launcher in launchers.items()
    }


TRAINING = {"sagemaker_distribution_instance_groups": '["train"]', "train-seconds": 2}


def test_ranks_run_on_the_training_group_and_the_data_host_runs_until_the_training_ends(hetero):
    roots = hetero(TRAINING)
    started = time.monotonic()
    ended = run_all(roots)
    assert {host: code for host, (code, _) in ended.items()} == dict.fromkeys(roots, 0), ended[
        DATA_HOSTS[0]
    ][1][-3000:]
    assert time.monotonic() - started < 90  # the data host's 600 s server was stopped
    leader = ended[TRAIN_HOSTS[0]][1]
    assert "data hosts (other instance groups, the script on its own): 127.0.0.3" in leader
    assert "launcher: all 3 hosts ready" in leader
    data_dir = roots[TRAIN_HOSTS[0]] / "output" / "data"  # where every rank writes
    ranks = [
        json.loads((data_dir / f"{host}-{rank}.json").read_text())
        for rank, host in enumerate(TRAIN_HOSTS)
    ]
    for rank in ranks:  # the world of the ranks is the training group's hosts alone
        assert (
            rank["SM_CURRENT_INSTANCE_GROUP"],
            rank["OMPI_COMM_WORLD_SIZE"],
            rank["sum"],
            rank["SM_CURRENT_INSTANCE_TYPE"],
        ) == ("train", "2", 2, "ml.p4d.24xlarge")
    data = json.loads(
        (roots[DATA_HOSTS[0]] / "output" / "data" / "127.0.0.3-alone.json").read_text()
    )
    assert data["SM_CURRENT_INSTANCE_GROUP"] == "data"
    assert data["SM_CURRENT_INSTANCE_TYPE"] == "ml.c5.18xlarge"
    assert data["OMPI_COMM_WORLD_SIZE"] is None  # not under mpirun
    assert data["KERAS_DISTRIBUTION_NUM_PROCESSES"] is None  # no process of the ranks' job
    assert data["SM_IS_HETERO"] == "true"
    assert json.loads(data["SM_DISTRIBUTION_INSTANCE_GROUPS"]) == ["train"]
    assert json.loads(data["SM_HOSTS"]) == [*TRAIN_HOSTS, *DATA_HOSTS]
    assert json.loads(data["SM_CURRENT_INSTANCE_GROUP_HOSTS"]) == list(DATA_HOSTS)
    assert "the leader 127.0.0.1 reports exit code 0" in ended[DATA_HOSTS[0]][1]


def test_one_training_host_runs_its_ranks_locally_beside_a_data_host(hetero):
    """No ssh between training hosts, yet the data host still joins the leader and ends with
    the job."""
    roots = hetero({**TRAINING, "processes_per_host": 2}, groups=ONE_TRAINING_HOST)
    ended = run_all(roots)
    assert {host: code for host, (code, _) in ended.items()} == dict.fromkeys(roots, 0), ended[
        "127.0.0.1"
    ][1][-3000:]
    data_dir = roots["127.0.0.1"] / "output" / "data"
    assert [
        json.loads((data_dir / f"127.0.0.1-{rank}.json").read_text())["sum"] for rank in (0, 1)
    ] == [2, 2]
    assert (roots["127.0.0.3"] / "output" / "data" / "127.0.0.3-alone.json").exists()


def test_the_data_host_ends_the_helper_its_script_left_and_exits_with_the_training(hetero):
    """The script starts a helper that holds the script's output for 60 s: the training's end
    ends both, and the data host exits then, not when the helper would have ended. (One that
    ignores SIGTERM is killed 10 s later: tests/container/test_session.py.)"""
    roots = hetero({**TRAINING, "train-seconds": 5, "data-helper": ""}, groups=ONE_TRAINING_HOST)
    started = time.monotonic()
    ended = run_all(roots)
    took = time.monotonic() - started
    data = ended[DATA_HOSTS[0]][1]
    assert {host: code for host, (code, _) in ended.items()} == dict.fromkeys(roots, 0), data
    assert took < 30, data  # the helper's 60 s
    helper = int((roots[DATA_HOSTS[0]] / "output" / "data" / "helper.pid").read_text())
    assert not running(helper), data
    assert "launcher: the job ended on another host; ending python" in data, data


# The data host serves batches (AWS's pattern: a tf.data service on the data group); the rank,
# stopped, saves a checkpoint that needs one more batch from it.
SERVE_THROUGH_THE_STOP = """
import json, os, socket, time
with open(os.path.join(os.environ["SM_INPUT_CONFIG_DIR"], "hyperparameters.json")) as config:
    port = int(json.load(config)["data_service_port"])  # free: a script job runs no service
out = os.environ["SM_OUTPUT_DATA_DIR"]
if os.environ["SM_CURRENT_INSTANCE_GROUP"] == "data":
    server = socket.create_server(("127.0.0.3", port))
    open(os.path.join(out, "serving"), "w").close()
    while True:
        connection, _ = server.accept()
        connection.sendall(b"batch\\n")
        connection.close()
from train.rank import StopRequest
StopRequest.arm()  # this rank saves on a stop
open(os.path.join(out, "training"), "w").close()
while not StopRequest.requested():
    time.sleep(0.05)
time.sleep(1)  # the agreed step, then the save
try:
    with socket.create_connection(("127.0.0.3", port), timeout=10) as connection:
        last = connection.makefile().readline().strip()
except OSError as error:
    last = f"{type(error).__name__}: {error}"
with open(os.path.join(out, "saved"), "w") as saved:
    saved.write(last)
raise SystemExit(143)
"""


def test_a_stop_keeps_the_data_hosts_script_serving_until_the_ranks_have_saved(hetero):
    """SageMaker's SIGTERM reaches every host at once; the data host's script is not stopped
    by it but by the training's end, after the ranks' checkpoint, as the built-in data
    service is."""
    roots = hetero(
        {"sagemaker_distribution_instance_groups": "train"},
        groups=ONE_TRAINING_HOST,
        source=SERVE_THROUGH_THE_STOP,
    )
    launchers = {host: start(root) for host, root in reversed(roots.items())}
    ready = [
        roots[DATA_HOSTS[0]] / "output" / "data" / "serving",
        roots["127.0.0.1"] / "output" / "data" / "training",
    ]
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in ready):
        for launcher in launchers.values():
            assert launcher.poll() is None, launcher.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    for launcher in launchers.values():
        launcher.send_signal(signal.SIGTERM)
    outputs = {host: launcher.communicate(timeout=120)[0] for host, launcher in launchers.items()}
    codes = {host: launcher.returncode for host, launcher in launchers.items()}
    assert codes == dict.fromkeys(roots, 143), outputs[DATA_HOSTS[0]][-3000:]
    assert (roots["127.0.0.1"] / "output" / "data" / "saved").read_text() == "batch", outputs[
        DATA_HOSTS[0]
    ][-3000:]
    assert "runs on until the ranks have saved their checkpoint" in outputs[DATA_HOSTS[0]]


def test_a_failing_data_host_script_ends_the_training_with_its_reason(hetero):
    roots = hetero({**TRAINING, "train-seconds": 300, "data-fails": ""})
    started = time.monotonic()
    ended = run_all(roots)
    assert time.monotonic() - started < 90, "the training was not stopped"
    assert {code for code, _ in ended.values()} == {1}, ended[TRAIN_HOSTS[0]][1][-3000:]
    for host in roots:
        reason = failure_of(roots[host])
        assert reason.startswith("data host 127.0.0.3: "), reason
        assert "ValueError: the decoder crashed" in reason, reason


def test_a_data_host_that_vanishes_is_named_and_the_job_ends(hetero):
    roots = hetero({**TRAINING, "train-seconds": 300})
    data = start(roots[DATA_HOSTS[0]])
    workers = {host: start(roots[host]) for host in reversed(TRAIN_HOSTS)}
    while not (roots[DATA_HOSTS[0]] / "output" / "data" / "127.0.0.3-alone.json").exists():
        assert data.poll() is None, data.communicate()[0][-3000:]
        time.sleep(0.2)
    kill_host(data)  # the host is gone, script and all
    codes = {host: launcher.wait(timeout=90) for host, launcher in workers.items()}
    assert codes == dict.fromkeys(TRAIN_HOSTS, 3)
    reason = failure_of(roots[TRAIN_HOSTS[0]])
    assert reason.startswith("lost contact with host 127.0.0.3: "), reason


def test_the_built_in_trainer_reads_its_input_from_the_data_hosts_service(hetero):
    """Images decoded and augmented by the data host's tf.data service: the job trains to a
    accuracy far above chance, and the data host's servers stop when it ends. (That the ranks read
    nothing but the service: tests/image/test_hetero_cluster.py, where each host has files
    of its own.)"""
    roots = hetero(
        {
            "sagemaker_distribution_instance_groups": "train",
            "model": "cnn",
            "epochs": 6,
            "augment": "true",
            "image_size": 16,
        },
        program=None,
        data="images",
    )
    ended = run_all(roots, timeout=300)
    assert {host: code for host, (code, _) in ended.items()} == dict.fromkeys(roots, 0), ended[
        TRAIN_HOSTS[0]
    ][1][-3000:]
    leader, data = ended[TRAIN_HOSTS[0]][1], ended[DATA_HOSTS[0]][1]
    port = json.loads(
        (roots[DATA_HOSTS[0]] / "input" / "config" / "hyperparameters.json").read_text()
    )["data_service_port"]
    assert (
        f"training input served by the data hosts' tf.data service at "
        f"grpc://127.0.0.3:{port}" in leader
    )
    assert f"data service: dispatcher and worker on 127.0.0.3, dispatcher 127.0.0.3:{port}" in data
    metadata = json.loads((roots[TRAIN_HOSTS[0]] / "model" / "metadata.json").read_text())
    assert metadata["final_metrics"]["val_accuracy"] > 0.4, metadata["final_metrics"]  # of 0.1


def test_a_stop_reaching_every_host_checkpoints_with_the_service_still_serving(hetero):
    """SageMaker's SIGTERM reaches every host at once: the ranks agree on a step and save,
    reading their last batches from the data host, which keeps serving until they are done."""
    roots = hetero(
        {
            "sagemaker_distribution_instance_groups": "train",
            "model": "cnn",
            "epochs": 50,
            "image_size": 16,
        },
        program=None,
        data="images",
    )
    launchers = {host: start(root) for host, root in reversed(roots.items())}
    leader = launchers[TRAIN_HOSTS[0]]
    seen = []
    for line in leader.stdout:
        seen.append(line)
        if "METRICS epoch=1 " in line:
            break
    for launcher in launchers.values():
        launcher.send_signal(signal.SIGTERM)
    outputs = {host: launcher.communicate(timeout=120)[0] for host, launcher in launchers.items()}
    codes = {host: launcher.returncode for host, launcher in launchers.items()}
    assert codes == dict.fromkeys(roots, 143), "".join(seen) + outputs[TRAIN_HOSTS[0]][-3000:]
    assert failure_of(roots[TRAIN_HOSTS[0]]).startswith("training was stopped by a signal")
    states = sorted((roots[TRAIN_HOSTS[0]] / "checkpoints").glob("epoch-*/state.json"))
    assert json.loads(states[-1].read_text()).get("interrupted") is True


@pytest.mark.parametrize(
    "hyperparameters, program, message",
    [
        (
            {},
            "probe.py",
            "this job has 2 instance groups, train (2 x ml.p4d.24xlarge), data (1 x "
            "ml.c5.18xlarge), and names none to train: set the hyperparameter "
            "sagemaker_distribution_instance_groups",
        ),
        (
            {"sagemaker_distribution_instance_groups": "gpu"},
            "probe.py",
            "names ['gpu'], which this job does not have",
        ),
        (
            {"sagemaker_distribution_instance_groups": "train,data"},
            "probe.py",
            "different instance types (ml.c5.18xlarge, ml.p4d.24xlarge): set processes_per_host",
        ),
    ],
)
def test_what_cannot_run_is_refused_on_every_host_before_anything_starts(
    hetero, hyperparameters, program, message
):
    roots = hetero({**hyperparameters, "processes_per_host": 0}, program=program)
    for _host, root in roots.items():
        result = run_train(root, timeout=60)
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
        assert message in failure_of(root), failure_of(root)
