"""Sharded checkpoints (train.sharded_checkpoint) with the image's pinned Keras 3 and JAX: a
model split across 2 processes (mesh 1x4, 2 CPU devices each, loopback) saved by each process
into its own folder, the folders merged as S3 merges two hosts' checkpoint folders, restored
exactly into mesh 1x4 and 2x2 on 2 processes and on 1 process with 4 devices; a half-merged
folder is refused by every process with exit code 2, naming the missing files; a save from
mesh 2x2 (the model axis inside each process) is written by process 0 alone. The script,
train/examples/sharded_checkpoint_check.py, checks every shard's values itself."""

from __future__ import annotations

import re
import shutil

import pytest
from conftest import (
    add_code,
    compose_cluster,
    failure,
    local_cluster,
    restart,
    run_offline,
    wait_for_log,
)
from test_keras_jax import GUIDE
from test_tf_stack import HOSTS, tf_image  # noqa: F401

pytestmark = pytest.mark.container


@pytest.mark.slow
def test_a_model_split_across_processes_saves_per_host_and_restores_into_any_mesh(engine, tf_image):
    result = run_offline(
        engine, tf_image, "python", "-m", "train.examples.sharded_checkpoint_check", timeout=900
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    for phase in (
        "save mesh 1x4 on 2 processes, one folder each: exit codes [0, 0]",
        "restore merged into mesh 1x4 on 2 processes: exit codes [0, 0]",
        "restore merged into mesh 2x2 on 2 processes: exit codes [0, 0]",
        "restore merged into mesh 2x2 on 1 process x 4 devices: exit codes [0]",
        "restore merged into mesh 1x4 on 1 process x 4 devices: exit codes [0]",
        "restore a half-merged folder on 2 processes: exit codes [2, 2]",
        "save mesh 2x2 on 2 processes, one folder each: exit codes [0, 0]",
        "restore that merged into mesh 1x4 on 2 processes: exit codes [0, 0]",
    ):
        assert f"CHECK ok: {phase}" in output, output[-4000:]
    assert "CHECK FAILED" not in output, output[-4000:]
    # each host wrote its own two files; mesh 1x4: the replicated variables (biases, Adam's
    # counts) only on process 0: 6 split variables x 2 shards each, plus 8 replicated ones;
    # mesh 2x2: process 1 holds the same halves as process 0 and writes none of them
    assert (
        "FILES 1x4 [['process-00000-of-00002.json', 'process-00000-of-00002.npz'], "
        "['process-00001-of-00002.json', 'process-00001-of-00002.npz']]"
    ) in output, output[-4000:]
    shards = re.findall(r"SAVED process (\d) of 2, mesh (\dx\d): .*?, (\d+) shards", output)
    assert sorted(shards) == [
        ("0", "1x4", "20"),
        ("0", "2x2", "20"),
        ("1", "1x4", "12"),
        ("1", "2x2", "0"),
    ], output[-4000:]
    restored = re.findall(r"RESTORED .* 14 variables, 0 shards differ", output)
    assert len(restored) == 8, output[-4000:]  # 2 + 2 + 1 + 1 + 2 processes
    assert output.count("process-00001-of-00002.json; process-00001-of-00002.npz") == 2


# A user's script with the checkpoint helper (train.resumable) and a model split across the
# hosts: Keras 3 on JAX, mesh 1x4 over 2 hosts x 2 devices (the model axis across the hosts).
# On a stop, and after the resume, it prints a digest of every variable's whole value (the
# model's and Adam's; a gather every process joins) to show the resume had the exact weights.
RESUMABLE_SPLIT = """
import hashlib
import jax, keras, numpy as np
from train.jax_arrays import whole_value
from train.layouts import auto_model_parallel
from train.resumable import Checkpoints

keras.distribution.initialize()
mesh = keras.distribution.DeviceMesh((1, 4), ["data", "model"], keras.distribution.list_devices())
keras.distribution.set_distribution(
    auto_model_parallel(mesh, batch_dim_name="data", auto_shard_dataset=False))
process = jax.process_index()
keras.utils.set_random_seed(1)
x = np.random.default_rng(0).normal(size=(6000, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
checkpoints = Checkpoints(model)

def digest(label):
    values = [np.ascontiguousarray(whole_value(v.value)) for v in checkpoints.variables()]
    text = hashlib.sha256(b"".join(value.tobytes() for value in values)).hexdigest()
    print(f"WEIGHTS {label} process {process}: {text}", flush=True)

start = checkpoints.restore()
print(f"SPLIT {checkpoints.split_across_hosts()} initial_epoch {start.epoch}", flush=True)
if start.folder is not None:
    digest("restored")
try:
    # mesh 1x4 has one data replica: every process feeds the whole batch, the same one
    model.fit(x, y, batch_size=8, epochs=4, initial_epoch=start.epoch,
              callbacks=[checkpoints.callback()], verbose=2 if process == 0 else 0)
except SystemExit:
    digest("stopped")
    raise
print("trained to the end", flush=True)
"""


def host_checkpoints(spec, host: str) -> dict[str, list[str]]:
    """Each checkpoint folder on `host`'s own disk and the files in it (shards/ inlined)."""
    root = local_cluster.host_paths(spec, host).checkpoint_dir
    return {
        folder.name: sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
        for folder in sorted(root.glob("epoch-*"))
    }


def merge_hosts_checkpoints(spec) -> None:
    """Every host's checkpoint folder holds the union of all of them, as SageMaker's S3 sync
    leaves it: each host uploads its own, and a job restores the whole prefix into every host."""
    folders = [local_cluster.host_paths(spec, host).checkpoint_dir for host in HOSTS]
    for source in folders:
        for target in folders:
            if target != source:
                shutil.copytree(source, target, dirs_exist_ok=True)


@pytest.mark.slow
def test_a_script_with_a_model_split_across_hosts_resumes_from_merged_sharded_checkpoints(
    engine, tf_image, data, tmp_path
):
    """SIGTERM to the leader in epoch 2 of 4: every process writes its own shards into its own
    host's folder and the leader the state; the hosts' folders merged as S3 merges them, the
    job run again resumes at epoch 1 with every variable exactly as it stopped, and each host
    prunes its own copies."""
    folder = tmp_path / "code"
    folder.mkdir()
    script = folder / "resumable_split.py"
    script.write_text(RESUMABLE_SPLIT)
    hyperparameters = {k: str(v) for k, v in GUIDE.items()} | {"sagemaker_program": script.name}
    spec = local_cluster.ClusterSpec(
        hosts=2,
        workdir=tmp_path / "cluster",
        data=data,
        image=tf_image,
        hyperparameters=hyperparameters,
        environment={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    )
    # no "<letter>-" inside the project name: another session's sweep of its own prefix (say
    # `t-`) stopped a run named `resumable-split-...` (as test_keras_hub.py found)
    with compose_cluster(engine, spec, "resumablesplit2", edit=add_code(folder)) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        wait_for_log(cluster, "algo-1", "Epoch 2/4", timeout=300)
        engine.run("kill", "--signal", "TERM", cluster.containers()["algo-1"])
        codes = cluster.wait_all_exited(90)
        stopped = cluster.logs("algo-1")
        assert codes == {"algo-1": 143, "algo-2": 143}, stopped[-3000:]
        assert "SPLIT True initial_epoch 0" in stopped, stopped[-3000:]
        # each host holds its own shards; only the leader's copy holds the state
        own = {"algo-1": "process-00000-of-00002", "algo-2": "process-00001-of-00002"}
        for host in HOSTS:
            files = [f"shards/{own[host]}.json", f"shards/{own[host]}.npz"]
            if host == "algo-1":
                files.append("state.json")
            expected = {name: sorted(files) for name in ("epoch-000001", "epoch-000001.1")}
            assert host_checkpoints(spec, host) == expected, stopped[-3000:]
        assert failure(spec, "algo-1").startswith(
            "training was stopped by a signal (job stopped, max runtime or spot reclaim); "
            "checkpoint saved in /opt/ml/checkpoints/epoch-000001.1; a restarted job "
            "resumes from it"
        ), failure(spec, "algo-1")
        every_host = "\n".join(cluster.logs(host) for host in HOSTS)
        stopped_weights = re.findall(r"WEIGHTS stopped process (\d): (\w+)", every_host)
        merge_hosts_checkpoints(spec)
        restart(cluster, spec)
        codes = cluster.wait_all_exited(300)
        resumed = cluster.logs("algo-1")
        every_host = "\n".join(cluster.logs(host) for host in HOSTS)
    assert codes == {"algo-1": 0, "algo-2": 0}, (failure(spec, "algo-1"), every_host[-3000:])
    assert (
        "checkpoints: resumed from /opt/ml/checkpoints/epoch-000001.1 (epoch 1, step" in resumed
    ), (failure(spec, "algo-1"), every_host[-3000:])
    assert "SPLIT True initial_epoch 1" in resumed and "trained to the end" in resumed
    restored_weights = sorted(set(re.findall(r"WEIGHTS restored process (\d): (\w+)", every_host)))
    stopped_weights = sorted(set(stopped_weights))  # a line in both hosts' logs counts once
    assert len(stopped_weights) == 2 and len({w for _, w in stopped_weights}) == 1, stopped
    assert restored_weights == stopped_weights, resumed[-3000:]
    # epochs 2, 3 and 4 saved, 2 kept: each host removed its own copies of the pruned ones
    for host in HOSTS:
        assert sorted(host_checkpoints(spec, host)) == ["epoch-000003", "epoch-000004"], host
