"""The TensorFlow 2.21 image (STACK=tf) on real containers: the same launcher starts one
MultiWorkerMirroredStrategy worker per host over mpirun, each with the TF_CONFIG the plan
wrote, and the faults end the way they end on the Horovod image. (The built-in trainer on this
image: tests/image/test_tf_trainer.py.)

The script is one written for AWS's TensorFlow container (train/examples/
aws_mwms_script.py); it knows nothing of this image.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from conftest import (
    BUILD_TIMEOUT_S,
    add_code,
    code_folder,
    compose_cluster,
    failure,
    local_cluster,
    logs,
    run_offline,
    run_script,
    wait_for_log,
)

from bench.cluster import container_times

pytestmark = pytest.mark.container

TF_IMAGE = os.environ.get("TEST_TF_IMAGE", local_cluster.TF_IMAGE)
SCRIPT = Path(__file__).parents[2] / "train" / "examples" / "aws_mwms_script.py"
LAUNCH = {
    "heartbeat_timeout": 3,
    "host_timeout": 120,
    "leader_timeout": 120,
    "stop_grace": 30,
    "sagemaker_multi_worker_mirrored_strategy_enabled": "true",
}
FAST = {**LAUNCH, "sagemaker_program": "aws_mwms_script.py"}
BUILTIN = {**LAUNCH, "learning_rate": 0.002}
HOSTS = ("algo-1", "algo-2")
NO_HANG = 60  # seconds: any host still running this long after a fault is a hang


@pytest.fixture(scope="session")
def tf_image(engine) -> str:
    """The TF 2.21 CPU image; `make test` builds it beside the unit tests (TEST_IMAGE_BUILT)."""
    if os.environ.get("TEST_IMAGE_BUILT") == "1":
        if engine.run("image", "inspect", TF_IMAGE, check=False).returncode:
            pytest.fail(f"TEST_IMAGE_BUILT=1 but there is no image {TF_IMAGE}")
        return TF_IMAGE
    result = run_script(
        ["bash", "scripts/build_image.sh"],
        {**engine.env, "STACK": "tf", "VARIANT": "cpu", "IMAGE": TF_IMAGE},
        BUILD_TIMEOUT_S - 60,
    )
    if result.returncode:
        pytest.fail(f"image build failed (exit {result.returncode}):\n{result.stderr[-6000:]}")
    return TF_IMAGE


def test_the_cpu_image_has_tensorflow_without_cuda_wheels(engine, tf_image):
    """The CPU and GPU builds of this stack start from the same base, so only the install
    layer's cache key keeps the GPU's CUDA wheels (4.5 GB) out of the CPU image."""
    result = run_offline(engine, tf_image, "pip", "list", "--format=freeze")
    assert result.returncode == 0, result.stderr
    packages = dict(line.split("==", 1) for line in result.stdout.splitlines() if "==" in line)
    assert packages.get("tensorflow") == "2.21.0", packages
    assert not [name for name in packages if name.startswith("nvidia-")], packages


@pytest.fixture
def code(tmp_path) -> Path:
    return code_folder(tmp_path, SCRIPT)


def run_to_end(engine, spec, name: str, code: Path) -> tuple[dict[str, int], str]:
    """Start every host with the script in /opt/ml/code; (host -> exit code, the logs)."""
    with compose_cluster(engine, spec, name, edit=add_code(code)) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        codes = cluster.wait_all_exited(600)
        return codes, logs(cluster)


def stop_the_leader_in_epoch_2(engine, cluster) -> str:
    """Start the 2-host `cluster`, SIGTERM its leader once epoch 1 is reported; both hosts
    must stop with 143 within NO_HANG s. The leader's log."""
    cluster.compose("up", "-d", capture=True, timeout=300)
    wait_for_log(cluster, "algo-1", "METRICS epoch=1 ", timeout=300)
    engine.run("kill", "--signal", "TERM", cluster.containers()["algo-1"])
    codes = cluster.wait_all_exited(NO_HANG)
    stopped = cluster.logs("algo-1")
    assert codes == {"algo-1": 143, "algo-2": 143}, stopped[-3000:]
    return stopped


def cluster_spec(tmp_path, image, data, hosts=2, base=FAST, **hyperparameters):
    values = {k: str(v) for k, v in {**base, **hyperparameters}.items()}
    return local_cluster.ClusterSpec(
        hosts=hosts,
        workdir=tmp_path / "cluster",
        data=data,
        image=image,
        hyperparameters=values,
        sharded=frozenset({"train"}),
    )


def test_an_aws_mwms_script_trains_on_two_hosts_with_identical_weights(
    engine, tf_image, data, tmp_path, code
):
    spec = cluster_spec(tmp_path, tf_image, data, epochs=3)
    with compose_cluster(engine, spec, "mwms", edit=add_code(code)) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        codes = cluster.wait_all_exited(600)
        output = {host: cluster.logs(host) for host in HOSTS}
    assert codes == {"algo-1": 0, "algo-2": 0}, output
    leader = output["algo-1"]  # mpirun runs on the leader: every rank's lines are in its log
    assert "worker 0 of 2 on algo-1: 2 replicas, TensorFlow 2.21.0, tf.keras is tf_keras" in leader
    assert "worker 1 of 2 on algo-2: 2 replicas" in leader
    assert '"tf_workers":["algo-1:8890","algo-2:8890"]' in leader
    weights = set(re.findall(r"WEIGHTS worker \d: (\w+)", leader))
    assert len(weights) == 1 and len(re.findall(r"WEIGHTS worker", leader)) == 2, leader[-3000:]
    accuracy = float(re.search(r"ACCURACY ([\d.]+)", leader)[1])
    assert accuracy > 0.85, leader[-3000:]
    saved = local_cluster.host_paths(spec, "algo-1").model_dir / "1" / "saved_model.pb"
    assert saved.is_file()  # the chief's copy; the worker saved to its scratch folder
    assert not any(local_cluster.host_paths(spec, "algo-2").model_dir.iterdir())
    assert failure(spec, "algo-1") == failure(spec, "algo-2") == ""


@pytest.mark.parametrize(
    "stack, hyperparameters, names",
    [
        ("tf", {"sagemaker_mpi_enabled": "true"}, "run it on the Horovod image"),
        (
            "horovod",
            {"sagemaker_multi_worker_mirrored_strategy_enabled": "true"},
            "run it on the TensorFlow 2.21 image (docker build --build-arg STACK=tf)",
        ),
    ],
)
def test_a_distribution_the_image_lacks_exits_2_naming_the_image(
    engine, image, tf_image, data, tmp_path, code, stack, hyperparameters, names
):
    chosen = tf_image if stack == "tf" else image
    settings = {**FAST, **hyperparameters}
    if stack == "tf":
        settings.pop("sagemaker_multi_worker_mirrored_strategy_enabled")
    spec = local_cluster.ClusterSpec(
        hosts=2,
        workdir=tmp_path / "cluster",
        data=data,
        image=chosen,
        hyperparameters={k: str(v) for k, v in settings.items()},
    )
    codes, output = run_to_end(engine, spec, "wrong-image", code)
    assert codes == {"algo-1": 2, "algo-2": 2}, output
    for host in HOSTS:
        assert names in failure(spec, host), failure(spec, host)


def fault_seconds(engine, cluster, fault_at: float) -> float:
    containers = cluster.containers()
    return max(container_times(engine, containers[host])[1] for host in HOSTS) - fault_at


def signal_in_epoch_3(
    engine, spec, code: Path, signal: str, victim: str, stack: str
) -> tuple[dict[str, int], str]:
    """Send `signal` to `victim`'s container once the leader trains its third epoch; (host ->
    exit code, the logs), printing how long after the signal the last host exited."""
    with compose_cluster(engine, spec, f"signal-{signal.lower()}", edit=add_code(code)) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        wait_for_log(cluster, "algo-1", "Epoch 3/", timeout=300)
        fault_at = time.time()
        engine.run("kill", "--signal", signal, cluster.containers()[victim])
        exited = cluster.wait_all_exited(NO_HANG)
        print(
            f"\n{stack}: SIG{signal} to {victim}, last exit "
            f"{fault_seconds(engine, cluster, fault_at):.1f} s after it"
        )
        return exited, logs(cluster)


def test_a_worker_that_raises_fails_the_job_naming_it(engine, tf_image, data, tmp_path, code):
    spec = cluster_spec(tmp_path, tf_image, data, **{"fail-on-worker": 1})
    codes, output = run_to_end(engine, spec, "mwms-raises", code)
    assert codes == {"algo-1": 1, "algo-2": 1}, output
    for host in HOSTS:
        assert failure(spec, host).startswith(
            "rank 1 on host algo-2 failed (exit code 1): ValueError: worker 1 cannot parse its "
            "data (at aws_mwms_script.py, line"
        ), failure(spec, host)


@pytest.mark.parametrize(
    "victim, codes, survivor, cause",
    [
        ("algo-2", {"algo-1": 3, "algo-2": 137}, "algo-1", "lost contact with host algo-2"),
        pytest.param(
            "algo-1",
            {"algo-1": 137, "algo-2": 3},
            "algo-2",
            "lost contact with the leader algo-1: ",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_killed_host_fails_the_job_naming_it(
    engine, tf_image, data, tmp_path, code, victim, codes, survivor, cause
):
    spec = cluster_spec(tmp_path, tf_image, data, epochs=500)
    exited, output = signal_in_epoch_3(engine, spec, code, "KILL", victim, "MWMS")
    assert exited == codes, output
    assert failure(spec, survivor).startswith(cause), failure(spec, survivor)


@pytest.mark.slow
def test_a_frozen_worker_fails_the_job_naming_its_host(engine, tf_image, data, tmp_path, code):
    """TensorFlow's coordination service stops the job when a worker stops sending heartbeats
    (an unmodified script sets no collective timeout); the failure file names that worker's
    host first. The launcher's watchdog (progress_timeout) is the backstop, set long here."""
    spec = cluster_spec(tmp_path, tf_image, data, epochs=5000, steps=5, progress_timeout=120)
    with compose_cluster(engine, spec, "mwms-frozen", edit=add_code(code)) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        wait_for_log(cluster, "algo-1", "Epoch 3/", timeout=300)
        fault_at = time.time()
        engine.run(
            "exec", cluster.containers()["algo-2"], "pkill", "-STOP", "-f", "train.script_runner"
        )
        codes = cluster.wait_all_exited(NO_HANG)
        print(
            f"\nMWMS: worker on algo-2 frozen (SIGSTOP), last exit "
            f"{fault_seconds(engine, cluster, fault_at):.1f} s after the fault"
        )
        output = logs(cluster)
    assert codes == {"algo-1": 1, "algo-2": 1}, output
    for host in HOSTS:
        assert failure(spec, host).startswith(
            "TensorFlow worker 1 (rank 1 on host algo-2) stopped sending heartbeats: frozen, or "
            "its host is gone; rank 0 on host algo-1 failed (exit code 1): UnavailableError"
        ), failure(spec, host)
