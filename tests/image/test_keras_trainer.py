"""The built-in trainer with Keras 3 on JAX (`backend=jax`, the TensorFlow 2.21 image), on real
containers: the same trainer as on Horovod and MWMS (train.framework picks the Keras, train.sync
the synchronisation): accumulation with a fixed global batch, an export `serve` answers, and
exact resume after SIGTERM mid-epoch (the final weights of a job never stopped)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import (
    assert_serves_the_digits,
    compose_cluster,
    kill_a_worker_rank_in_epoch_2,
    local_cluster,
    newest_checkpoint,
    restart,
)
from test_tf_stack import BUILTIN, cluster_spec, stop_the_leader_in_epoch_2, tf_image  # noqa: F401

pytestmark = pytest.mark.container

ON_JAX = {
    key: value
    for key, value in BUILTIN.items()
    if key != "sagemaker_multi_worker_mirrored_strategy_enabled"
} | {"backend": "jax"}
# 2 micro-batches of 4 per device and step: 89 steps, 178 batches an epoch on the digits
EXACT = {"epochs": 3, "global_batch_size": 16, "max_device_batch_size": 4, "dropout_rate": 0}


def run_job(engine, spec, name: str) -> tuple[dict[str, int], str]:
    with compose_cluster(engine, spec, name) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        codes = cluster.wait_all_exited(600)
        return codes, cluster.logs("algo-1")


def final_arrays(spec, epochs: int) -> list[np.ndarray]:
    folder = local_cluster.host_paths(spec, "algo-1").checkpoint_dir / f"epoch-{epochs:06d}"
    with np.load(folder / "ckpt.npz") as arrays:
        return [arrays[f"arr_{index}"] for index in range(len(arrays.files))]


@pytest.fixture(scope="module")
def reference(engine, tf_image, data, tmp_path_factory) -> local_cluster.ClusterSpec:
    """A job never stopped, on 2 hosts."""
    spec = cluster_spec(tmp_path_factory.mktemp("reference"), tf_image, data, base=ON_JAX, **EXACT)
    codes, leader = run_job(engine, spec, "jax-reference")
    assert codes == {"algo-1": 0, "algo-2": 0}, leader[-3000:]
    assert (
        "2 rank(s): 0@algo-1, 1@algo-2; TensorFlow 2.21.0, Keras 3 on JAX "
        "(keras.distribution)" in leader
    )  # and both ended with the same weights
    assert "global batch 16 = 2 device(s) x 2 accumulated micro-batch(es) x 4" in leader
    # longer than the watchdog's allowances (train.jax_heartbeat), said once, by rank 0
    assert leader.count("trainer: JAX's heartbeat timeout is 1860 s, not its default 100 s") == 1
    return spec


def test_the_builtin_trainer_on_jax_trains_on_two_hosts_and_serve_answers_its_model(
    engine, tf_image, data, reference
):
    model = local_cluster.host_paths(reference, "algo-1").model_dir
    metadata = json.loads((model / "metadata.json").read_text())
    assert metadata["model_path"] == "model.keras" and metadata["keras"].startswith("3.")
    assert metadata["world_size"] == 2 and metadata["final_metrics"]["val_accuracy"] > 0.9
    assert not any(local_cluster.host_paths(reference, "algo-2").model_dir.iterdir())
    assert_serves_the_digits(engine, tf_image, model, data)


def test_the_builtin_trainer_on_jax_stopped_mid_epoch_ends_as_a_job_never_stopped(
    engine, tf_image, data, tmp_path, reference
):
    """SIGTERM to the leader during epoch 2, with 2 micro-batches accumulated per step: both
    hosts stop after the same optimizer step (never between micro-batches), rank 0 saves, and
    the restarted job (rank 0 reads the checkpoint, every process assigns it) ends with the
    weights and optimizer state of the job never stopped. With a checkpoint every 0.3 s
    (checkpoint_every_minutes) as well: saved inside `fit`, where Keras 3 keeps the values
    apart from the variables, they change nothing."""
    spec = cluster_spec(
        tmp_path, tf_image, data, base=ON_JAX, **EXACT, checkpoint_every_minutes=0.005
    )
    with compose_cluster(engine, spec, "jax-resume") as cluster:
        stop_the_leader_in_epoch_2(engine, cluster)
        _, state = newest_checkpoint(spec)
        assert state.get("interrupted") is True and state["epoch_samples"] % 16 == 0, state
        restart(cluster, spec)
        codes = cluster.wait_all_exited(600)
        resumed = cluster.logs("algo-1")
    assert codes == {"algo-1": 0, "algo-2": 0}, resumed[-3000:]
    assert "resumed from /opt/ml/checkpoints/" in resumed, resumed[-3000:]
    expected = final_arrays(reference, EXACT["epochs"])
    got = final_arrays(spec, EXACT["epochs"])
    assert len(got) == len(expected)
    for index, (value, want) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-7, err_msg=f"array {index}")


@pytest.mark.slow
def test_the_builtin_trainer_on_jax_restarts_a_killed_process_and_ends_as_never_killed(
    engine, tf_image, data, tmp_path, reference
):
    """SIGKILL (the out-of-memory killer's signature) to the process on algo-2 in epoch 2, with
    `max_restarts` 1 and a checkpoint every 0.3 s: the leader runs every process again from
    the newest checkpoint, and the job ends with the weights of the job never killed."""
    spec = cluster_spec(
        tmp_path,
        tf_image,
        data,
        base=ON_JAX,
        **EXACT,
        max_restarts=1,
        checkpoint_every_minutes=0.005,
    )
    codes, leader = kill_a_worker_rank_in_epoch_2(engine, spec, "jax-restart")
    assert codes == {"algo-1": 0, "algo-2": 0}, leader[-3000:]
    assert "attempt 1 failed (exit code" in leader and "restarting every rank" in leader
    assert "the job succeeded after 1 restart(s)" in leader
    for index, (value, want) in enumerate(
        zip(final_arrays(spec, EXACT["epochs"]), final_arrays(reference, EXACT["epochs"]))
    ):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-7, err_msg=f"array {index}")
