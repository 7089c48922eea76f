"""The built-in trainer's `model_parallel` hyperparameter and the data x model mesh it makes
(job.mesh): what the launcher refuses before anything starts (exit 2), and how many replicas
and readers a mesh has, which the batch plan counts."""

from __future__ import annotations

import pytest

from job.batching import plan_batches
from job.errors import ConfigError
from job.hyperparameters import parse
from job.mesh import Mesh, forced_devices
from job.trainer_config import TrainerConfig


def test_model_parallel_defaults_to_one_and_needs_the_jax_stack():
    assert parse(TrainerConfig, {})[0].model_parallel == 1
    assert parse(TrainerConfig, {"backend": "jax", "model_parallel": "4"})[0].model_parallel == 4
    with pytest.raises(
        ConfigError,
        match=r"model_parallel=2 .* Keras 3 on JAX only, but "
        r"backend=tensorflow; set backend=jax .* or model_parallel=1",
    ):
        parse(TrainerConfig, {"model_parallel": "2"})
    with pytest.raises(
        ConfigError, match=r"model_parallel=.0. is invalid: expected an integer >= 1"
    ):
        parse(TrainerConfig, {"backend": "jax", "model_parallel": "0"})


@pytest.mark.parametrize(
    "mesh, message",
    [
        (
            Mesh(2, 2, 3),
            "model_parallel=3 does not divide the job's 4 device(s) (2 process(es) x "
            "2); use one of 1, 2, 4",
        ),
        (
            Mesh(3, 4, 6),
            "model_parallel=6 neither divides each process's 4 device(s) nor is a multiple of them",
        ),
    ],
)
def test_a_model_axis_that_does_not_fit_the_devices_says_which_would(mesh, message):
    assert message in mesh.problem()


@pytest.mark.parametrize(
    "mesh, replicas, group, readers",
    [
        (Mesh(2, 2, 1), 4, 1, 2),  # today's data parallelism: one reader per process
        (Mesh(2, 2, 2), 2, 1, 2),  # the model axis inside each process
        (Mesh(2, 2, 4), 1, 2, 1),  # the model axis across both: they read the same input
        (Mesh(8, 1, 4), 2, 4, 2),  # one GPU per process: replicas are readers
    ],
)
def test_replicas_and_readers_of_a_mesh(mesh, replicas, group, readers):
    assert mesh.problem() is None
    assert (mesh.replicas, mesh.group, mesh.readers) == (replicas, group, readers)
    assert [mesh.reader(rank) for rank in range(mesh.processes)] == [
        rank // group for rank in range(mesh.processes)
    ]


def test_the_global_batch_and_learning_rate_count_replicas_not_devices():
    """8 GPUs, a model axis of 4: 2 replicas of 32 samples, learning rate x 64/32."""
    mesh = Mesh(8, 1, 4)
    plan = plan_batches(
        world_size=mesh.readers,
        global_batch_size=0,
        per_device_batch_size=32,
        max_device_batch_size=256,
        learning_rate=0.001,
        base_batch_size=32,
        scale_learning_rate=True,
        model_parallel=4,
    )
    assert (plan.global_batch, plan.learning_rate) == (64, 0.002)
    assert plan.derivation().startswith(
        "global batch 64 = 2 data-parallel replica(s) of 4 devices x 1 accumulated"
    )


def test_cpu_devices_per_process_come_from_xla_flags():
    assert forced_devices({}) == 1
    assert forced_devices({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}) == 2
