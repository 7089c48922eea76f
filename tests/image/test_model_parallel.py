"""The built-in trainer with a model axis (`model_parallel`, Keras 3 on JAX) on real containers:
2 hosts of 2 CPU devices each (XLA_FLAGS), the model axis inside each host (2) and across both
(4). The log says what the model weighs per device and how many weights were split (the
derived layout splits the kernels: never the all-replicated warning), the batch plan counts
replicas, the whole model is gathered for the export that `serve` answers, and the job split
across hosts (with 2 accumulated micro-batches per step) ends with the weights of a
one-process job (a wrong collective would show). Its checkpoints are sharded: each host's
folder holds only its own process's shards (no gathered .npz), and a job stopped mid-epoch, or
one whose process on algo-2 is killed (`max_restarts`), resumes from them before any S3 merge
(each host sends the others what they lack) and ends with the weights of the job never
stopped."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from conftest import (
    assert_serves_the_digits,
    compose_cluster,
    kill_a_worker_rank_in_epoch_2,
    newest_checkpoint,
    restart,
)
from test_keras_trainer import ON_JAX, final_arrays, run_job
from test_tf_stack import HOSTS, stop_the_leader_in_epoch_2, tf_image  # noqa: F401

from scripts import local_cluster
from train.sharded_checkpoint import read_manifest, read_whole

pytestmark = pytest.mark.container

SMALL = {"epochs": 3, "dropout_rate": 0, "hidden_units": "64,32", "learning_rate": 0.004}
# 2 micro-batches of 16 per step (Keras 3's optimizer accumulating): 45 steps an epoch
ACCUMULATE = {"global_batch_size": 32, "max_device_batch_size": 16}
OWN = {"algo-1": "shards/process-00000-of-00002", "algo-2": "shards/process-00001-of-00002"}


def spec_of(tmp_path, image, data, hosts: int, devices: int, **hyperparameters):
    """A FullyReplicated train channel: hosts that a model axis spans read the same data."""
    values = {k: str(v) for k, v in {**ON_JAX, **SMALL, **hyperparameters}.items()}
    return local_cluster.ClusterSpec(
        hosts=hosts,
        workdir=tmp_path / "cluster",
        data=data,
        image=image,
        hyperparameters=values,
        environment=(
            {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
            if devices > 1
            else {}
        ),
    )


def assert_split(leader: str, model_parallel: int) -> None:
    footprint = re.search(
        r"trainer: ([\d.]+K) parameters, ([\d.]+) kB; ([\d.]+) kB per device over a model "
        rf"axis of {model_parallel}\n",
        leader,
    )
    assert footprint, leader[-3000:]
    whole, per_device = float(footprint[2]), float(footprint[3])
    assert per_device < whole * 0.75, footprint[0]  # the kernels, most of it, are split
    assert f"trainer: model axis of {model_parallel}: 3 of 6 weights split (" in leader
    assert "ModelParallel sharded none" not in leader and "trainer: WARNING" not in leader


def host_files(spec, host: str, name: str) -> list[str]:
    """The files of checkpoint folder `name` on `host`'s own disk."""
    folder = local_cluster.host_paths(spec, host).checkpoint_dir / name
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def sharded_arrays(spec) -> list[np.ndarray]:
    """Every variable of the job's last checkpoint whole, in the order the trainer saves them
    (the model's, then the optimizer's), from both hosts' folders merged as SageMaker's S3
    sync merges them."""
    name = newest_checkpoint(spec)[0].name
    union = spec.workdir / "merged" / name
    for host in spec.host_names:
        folder = local_cluster.host_paths(spec, host).checkpoint_dir / name
        shutil.copytree(folder, union, dirs_exist_ok=True)
    manifest = read_manifest(union)
    manifest.close()
    return read_whole(union, list(manifest.variables.values()))


@pytest.fixture(scope="module")
def split(engine, tf_image, data, tmp_path_factory) -> local_cluster.ClusterSpec:
    """model_parallel=4 over 2 hosts x 2 devices, 2 micro-batches per step: one data-parallel
    replica, both hosts read the same batches. Never stopped."""
    spec = spec_of(
        tmp_path_factory.mktemp("split"), tf_image, data, 2, 2, model_parallel=4, **ACCUMULATE
    )
    codes, leader = run_job(engine, spec, "mp4")
    assert codes == {"algo-1": 0, "algo-2": 0}, leader[-3000:]
    assert (
        "global batch 32 = 1 data-parallel replica(s) of 4 devices x 2 accumulated "
        "micro-batch(es) x 16"
    ) in leader, leader[-3000:]
    assert_split(leader, 4)
    assert "trainer: the model is split across processes: each process writes its own" in leader
    return spec


def test_a_model_split_across_two_hosts_trains_as_one_process_would_and_serves(
    engine, tf_image, data, tmp_path, split
):
    """Its final checkpoint, each host's shards (no host holds the whole), equals a
    one-process, one-device job's with the same seed, global batch and accumulation."""
    final = f"epoch-{SMALL['epochs']:06d}"
    assert host_files(split, "algo-1", final) == [
        f"{OWN['algo-1']}.json",
        f"{OWN['algo-1']}.npz",
        "state.json",
    ]
    assert host_files(split, "algo-2", final) == [f"{OWN['algo-2']}.json", f"{OWN['algo-2']}.npz"]
    one = spec_of(tmp_path / "one", tf_image, data, 1, 1, **ACCUMULATE)
    codes, alone = run_job(engine, one, "mp-one")
    assert codes == {"algo-1": 0}, alone[-3000:]
    assert "global batch 32 = 1 device(s) x 2 accumulated micro-batch(es) x 16" in alone
    assert "the model is split across processes" not in alone
    got, want = sharded_arrays(split), final_arrays(one, SMALL["epochs"])
    # 6 weights, Adam's step count and 2 x 6 moments, and what its accumulation keeps
    assert len(got) == len(want) >= 19, (len(got), len(want))
    for index, (value, expected) in enumerate(zip(got, want)):
        np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-6, err_msg=f"array {index}")
    model = local_cluster.host_paths(split, "algo-1").model_dir
    assert sorted(p.name for p in model.iterdir()) == ["metadata.json", "model.keras"]
    assert_serves_the_digits(engine, tf_image, model, data)


def test_a_model_split_across_hosts_stopped_mid_epoch_resumes_from_its_shards(
    engine, tf_image, data, tmp_path, split
):
    """SIGTERM to the leader in epoch 2, with a checkpoint every 0.3 s as well (saved inside
    `fit`): each host's newest folder holds only its own shards, the leader's the state. Run
    again on the same hosts' folders, not merged (as a restart inside the job finds them; S3
    would have merged them for a new job), the leader takes the other host's files from it,
    every process reads its own pieces, and the job ends with the weights of the job never
    stopped."""
    spec = spec_of(
        tmp_path,
        tf_image,
        data,
        2,
        2,
        model_parallel=4,
        **ACCUMULATE,
        checkpoint_every_minutes=0.005,
    )
    with compose_cluster(engine, spec, "mpresume") as cluster:
        stop_the_leader_in_epoch_2(engine, cluster)
        newest, state = newest_checkpoint(spec)
        assert state.get("interrupted") is True and state["epoch_samples"] % 32 == 0, state
        for host in ("algo-1", "algo-2"):
            own = [f"{OWN[host]}.json", f"{OWN[host]}.npz"]
            expected = own + ["state.json"] if host == "algo-1" else own
            assert host_files(spec, host, newest.name) == expected, host
        restart(cluster, spec)
        codes = cluster.wait_all_exited(600)
        resumed = cluster.logs("algo-1")
    assert codes == {"algo-1": 0, "algo-2": 0}, resumed[-3000:]
    assert f"trainer: resumed from /opt/ml/checkpoints/{newest.name} at" in resumed, resumed[-3000:]
    assert f"copied 2 shard file(s) of {newest.name} that only other hosts held" in resumed
    assert newest_checkpoint(spec)[1]["epochs_done"] == SMALL["epochs"]
    got, want = sharded_arrays(spec), sharded_arrays(split)
    assert len(got) == len(want)
    for index, (value, expected) in enumerate(zip(got, want)):
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-7, err_msg=f"array {index}")


@pytest.mark.slow
def test_a_model_split_across_hosts_restarts_a_killed_process_and_ends_as_never_killed(
    engine, tf_image, data, tmp_path, split
):
    """SIGKILL to the process on algo-2 in epoch 2, with `max_restarts` 1 and a checkpoint
    every 0.3 s: the launcher runs every process again, each host still holding only its own
    shards (nothing merged them), so the hosts send each other what they lack, and the job
    ends with the weights of the job never killed."""
    spec = spec_of(
        tmp_path,
        tf_image,
        data,
        2,
        2,
        model_parallel=4,
        **ACCUMULATE,
        max_restarts=1,
        checkpoint_every_minutes=0.005,
    )
    codes, leader = kill_a_worker_rank_in_epoch_2(engine, spec, "mprestart")
    assert codes == {"algo-1": 0, "algo-2": 0}, leader[-3000:]
    assert "the job succeeded after 1 restart(s)" in leader, leader[-3000:]
    resumed = re.search(r"trainer: resumed from /opt/ml/checkpoints/(epoch-[\d.]+) at", leader)
    assert resumed, leader[-3000:]
    assert f"copied 2 shard file(s) of {resumed[1]} that only other hosts held" in leader
    got, want = sharded_arrays(spec), sharded_arrays(split)
    assert len(got) == len(want)
    for index, (value, expected) in enumerate(zip(got, want)):
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-7, err_msg=f"array {index}")


def run_on_checkpoints(engine, spec, name: str, checkpoints: dict[str, list]) -> str:
    """Run `spec` with each host's checkpoint folder holding the union of the folders listed
    for it (as S3 restores a prefix); the leader's log, once every host exited 0."""
    with compose_cluster(engine, spec, name) as cluster:
        for host, sources in checkpoints.items():
            for source in sources:
                target = local_cluster.host_paths(spec, host).checkpoint_dir
                shutil.copytree(source, target, dirs_exist_ok=True)
        cluster.compose("up", "-d", capture=True, timeout=300)
        codes = cluster.wait_all_exited(600)
        leader = cluster.logs("algo-1")
    assert codes == {"algo-1": 0, "algo-2": 0}, leader[-3000:]
    return leader


@pytest.mark.slow
def test_a_job_run_again_on_another_mesh_resumes_from_either_kind_of_checkpoint(
    engine, tf_image, data, tmp_path, split
):
    """Another mesh, both ways. The split job's checkpoints, in every host as S3 restores the
    hosts' merged prefix, resumed with model_parallel=2 (each process now holds a whole
    replica: the leader's whole checkpoint) and one more epoch: the leader reads the whole
    model from both hosts' shards. That job's whole checkpoint resumed with model_parallel=4
    again and one more epoch: the leader reads it, every process keeps its own pieces, and the
    new checkpoints are sharded again."""
    # a global batch of 64 keeps an accumulating optimizer on both meshes (2 replicas x 2
    # micro-batches, then 1 x 4): the same variables, which the leader's .npz holds by order
    batches = {**ACCUMULATE, "global_batch_size": 64}
    written = [local_cluster.host_paths(split, host).checkpoint_dir for host in split.host_names]
    inside = spec_of(tmp_path / "in", tf_image, data, 2, 2, model_parallel=2, **batches, epochs=4)
    leader = run_on_checkpoints(engine, inside, "mpreshard", {h: written for h in HOSTS})
    resumed = "trainer: resumed from /opt/ml/checkpoints/epoch-000003 at epoch 4\n"
    assert resumed in leader, leader[-3000:]
    assert "trainer: training from epoch 4 to the end of epoch 4" in leader
    assert "2 data-parallel replica(s) of 2 devices x 2 accumulated micro-batch(es)" in leader
    assert "the model is split across processes" not in leader
    assert host_files(inside, "algo-1", "epoch-000004") == ["ckpt.npz", "state.json"]

    whole = [local_cluster.host_paths(inside, "algo-1").checkpoint_dir]
    across = spec_of(tmp_path / "out", tf_image, data, 2, 2, model_parallel=4, **batches, epochs=5)
    leader = run_on_checkpoints(engine, across, "mpunshard", {h: whole for h in HOSTS})
    resumed = "trainer: resumed from /opt/ml/checkpoints/epoch-000004 at epoch 5\n"
    assert resumed in leader, leader[-3000:]
    assert "trainer: the model is split across processes" in leader
    for host in HOSTS:
        own = [f"{OWN[host]}.json", f"{OWN[host]}.npz"]
        assert host_files(across, host, "epoch-000005")[:2] == own, host


def test_a_model_axis_inside_each_host_makes_two_replicas(engine, tf_image, data, tmp_path):
    spec = spec_of(tmp_path, tf_image, data, 2, 2, model_parallel=2)
    codes, leader = run_job(engine, spec, "mp2")
    assert codes == {"algo-1": 0, "algo-2": 0}, leader[-3000:]
    assert "global batch 64 = 2 data-parallel replica(s) of 2 devices" in leader, leader[-3000:]
    assert_split(leader, 2)


def test_a_model_axis_that_does_not_divide_the_devices_exits_2_saying_which_would(
    engine, tf_image, data, tmp_path
):
    spec = spec_of(tmp_path, tf_image, data, 2, 2, model_parallel=3)
    codes, leader = run_job(engine, spec, "mp3")
    assert codes == {"algo-1": 2, "algo-2": 2}, leader[-3000:]
    assert "model_parallel=3 does not divide the job's 4 device(s)" in leader, leader[-3000:]
