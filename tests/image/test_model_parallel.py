"""The built-in trainer with a model axis (`model_parallel`, Keras 3 on JAX) on real containers:
2 hosts of 2 CPU devices each (XLA_FLAGS), the model axis inside each host (2) and across both
(4). The log says what the model weighs per device and how many weights were split (the
derived layout splits the kernels: never the all-replicated warning), the batch plan counts
replicas, the whole model is gathered for the export that `serve` answers, and the job split
across hosts ends with the weights of a one-process job (a wrong collective would show)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import assert_serves_the_digits
from test_keras_trainer import ON_JAX, final_arrays, run_job
from test_tf_stack import tf_image  # noqa: F401

from scripts import local_cluster

pytestmark = pytest.mark.container

SMALL = {"epochs": 3, "dropout_rate": 0, "hidden_units": "64,32", "learning_rate": 0.004}


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


def test_a_model_split_across_two_hosts_trains_as_one_process_would_and_serves(
    engine, tf_image, data, tmp_path
):
    """model_parallel=4 over 2 hosts x 2 devices: one data-parallel replica, both hosts read
    the same batches; its final checkpoint (gathered from both) equals a one-process,
    one-device job's with the same seed and global batch."""
    split = spec_of(tmp_path / "split", tf_image, data, 2, 2, model_parallel=4)
    codes, leader = run_job(engine, split, "mp4")
    assert codes == {"algo-1": 0, "algo-2": 0}, leader[-3000:]
    assert (
        "global batch 32 = 1 data-parallel replica(s) of 4 devices x 1 accumulated "
        "micro-batch(es) x 32"
    ) in leader, leader[-3000:]
    assert_split(leader, 4)
    one = spec_of(tmp_path / "one", tf_image, data, 1, 1)
    codes, alone = run_job(engine, one, "mp-one")
    assert codes == {"algo-1": 0}, alone[-3000:]
    assert "global batch 32 = 1 device(s)" in alone
    got, want = final_arrays(split, SMALL["epochs"]), final_arrays(one, SMALL["epochs"])
    assert len(got) == len(want) == 19  # 6 weights, the step count, Adam's 2 x 6 moments
    for index, (value, expected) in enumerate(zip(got, want)):
        np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-6, err_msg=f"array {index}")
    model = local_cluster.host_paths(split, "algo-1").model_dir
    assert sorted(p.name for p in model.iterdir()) == ["metadata.json", "model.keras"]
    assert_serves_the_digits(engine, tf_image, model, data)


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
