"""The built-in trainer on the TensorFlow 2.21 image (STACK=tf), on real containers: the same
features as on Horovod over MultiWorkerMirroredStrategy (accumulation, export and serve, exact
resume, a corrupt checkpoint skipped), and `make bench` item 9 with both images.
(Script mode and the fault cases: tests/image/test_tf_stack.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import (
    REPO,
    assert_serves_the_digits,
    compose_cluster,
    kill_a_worker_rank_in_epoch_2,
    local_cluster,
    newest_checkpoint,
    restart,
    set_epochs,
    tear_newest_checkpoint,
)
from test_tf_stack import BUILTIN, cluster_spec, stop_the_leader_in_epoch_2, tf_image  # noqa: F401

pytestmark = pytest.mark.container


def test_the_builtin_trainer_trains_on_two_hosts_survives_a_killed_worker_and_serves(
    engine, tf_image, data, tmp_path
):
    """With a fixed global batch that needs 2 accumulated micro-batches per device; the worker
    on algo-2 SIGKILLed (the out-of-memory killer's signature) in epoch 2, with `max_restarts`
    1: every worker runs again from the newest checkpoint and the job completes."""
    spec = cluster_spec(
        tmp_path,
        tf_image,
        data,
        base=BUILTIN,
        epochs=4,
        global_batch_size=64,
        max_device_batch_size=16,
        max_restarts=1,
        checkpoint_every_minutes=0.005,
    )
    codes, leader = kill_a_worker_rank_in_epoch_2(engine, spec, "mwms-builtin")
    assert codes == {"algo-1": 0, "algo-2": 0}, leader[-3000:]
    assert "the job succeeded after 1 restart(s)" in leader, leader[-3000:]
    assert "resumed from /opt/ml/checkpoints/" in leader
    assert (
        "2 rank(s): 0@algo-1, 1@algo-2; TensorFlow 2.21.0, MultiWorkerMirroredStrategy" in leader
    )  # and the trainer checked that both ended with the same weights
    assert "global batch 64 = 2 device(s) x 2 accumulated micro-batch(es) x 16" in leader
    model = local_cluster.host_paths(spec, "algo-1").model_dir
    metadata = json.loads((model / "metadata.json").read_text())
    assert metadata["world_size"] == 2 and metadata["final_metrics"]["val_accuracy"] > 0.9
    assert metadata["tensorflow"] == "2.21.0"
    assert not any(local_cluster.host_paths(spec, "algo-2").model_dir.iterdir())
    assert_serves_the_digits(engine, tf_image, model, data)


@pytest.mark.slow
def test_the_builtin_trainer_stopped_mid_epoch_resumes_at_its_step_then_skips_a_torn_one(
    engine, tf_image, data, tmp_path
):
    """SIGTERM to the leader: every worker takes part in the save, rank 0's copy is kept; the
    restarted job restores it on rank 0, hands it to the other worker, and continues at the
    step it stopped (per_device_batch_size 4: 180 steps an epoch, a stop lands mid-epoch; 10
    epochs, so that the stop lands before the end however slowly the log is read). The
    restart is asked for one epoch past the stopped one, so it runs at most two. Then that
    run's newest checkpoint is torn (as a partial S3 sync leaves it): the job started again
    skips it and resumes from the one before."""
    spec = cluster_spec(
        tmp_path, tf_image, data, base=BUILTIN, epochs=10, per_device_batch_size=4, dropout_rate=0
    )
    with compose_cluster(engine, spec, "mwms-resume") as cluster:
        stopped = stop_the_leader_in_epoch_2(engine, cluster)
        newest, state = newest_checkpoint(spec)
        if state.get("interrupted") is not True:  # the log's end: where the ranks were
            pytest.fail(f"newest checkpoint {state}\n{stopped[-6000:]}", pytrace=False)
        epochs = state["epochs_done"] + 2
        set_epochs(spec, epochs)
        restart(cluster, spec)
        codes = cluster.wait_all_exited(600)
        resumed = cluster.logs("algo-1")
        assert codes == {"algo-1": 0, "algo-2": 0}, resumed[-3000:]
        where = f"epoch {state['epochs_done'] + 1}" + (
            f", step {state['epoch_samples'] // 8 + 1}" if state["epoch_samples"] else ""
        )
        assert f"resumed from /opt/ml/checkpoints/{newest.name} at {where}" in resumed, resumed[
            -3000:
        ]
        _, final = newest_checkpoint(spec)
        assert final["epochs_done"] == epochs and final["samples_done"] == epochs * 180 * 8, final

        before, torn = tear_newest_checkpoint(spec, epochs=epochs + 1)
        restart(cluster, spec)
        codes = cluster.wait_all_exited(600)
        leader = cluster.logs("algo-1")
    assert codes == {"algo-1": 0, "algo-2": 0}, leader[-3000:]
    assert f"skipped checkpoint /opt/ml/checkpoints/{torn.name}" in leader, leader[-3000:]
    assert f"resumed from /opt/ml/checkpoints/{before.name} at epoch {epochs}" in leader, leader[
        -3000:
    ]
    assert f"METRICS epoch={epochs + 1} " in leader


@pytest.mark.slow
def test_the_stacks_benchmark_runs_both_images(image, tf_image, tmp_path):
    """`make bench` item 9 at its tiny size: the same job on the three stacks, numbers well formed
    (never compared with the target here: this machine is shared)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--tiny",
            "--only",
            "9",
            "--image",
            image,
            "--tf-image",
            tf_image,
            "--results",
            str(tmp_path / "results"),
            "--workdir",
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "results" / "bench-tiny-latest.json").read_text())["measurements"]
    assert [row["metric"] for row in rows] == [
        "stacks: MWMS (TF 2.21 image) vs Horovod (TF 2.15), 2 ranks",
        "stacks: Keras 3 on JAX (TF 2.21 image) vs Horovod (TF 2.15), 2 ranks",
        "stacks: Horovod scaling, 2 ranks vs 1",
        "stacks: MWMS scaling, 2 ranks vs 1",
        "stacks: Keras 3 on JAX scaling, 2 ranks vs 1",
    ]
    assert all(row["value"] > 0 and row["reference"] > 0 for row in rows), rows
