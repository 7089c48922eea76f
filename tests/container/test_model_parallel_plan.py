"""The launcher's plan for the built-in trainer with a model axis (`model_parallel`, Keras 3 on
JAX): checked against the devices it gives each process before anything starts (a config
error, exit 2, saying what to change), and the batch plan counts data-parallel replicas."""

from __future__ import annotations

import pytest

from job.errors import ConfigError
from job.validated import TENSORFLOW, validate_hyperparameters
from tests.container.test_mpirun import ENV, job, plan

FORCED = {**ENV, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def planned(hyperparameters, gpu_count=0, environ=FORCED):
    the_job = job(["algo-1", "algo-2"], "algo-1", {"backend": "jax", **hyperparameters})
    return plan(the_job, gpu_count, environ, TENSORFLOW)


@pytest.mark.parametrize("model_parallel, replicas", [(1, 2), (2, 2), (4, 1)])
def test_two_cpu_hosts_of_two_devices_count_replicas_in_the_global_batch(model_parallel, replicas):
    batches = planned({"model_parallel": str(model_parallel)}).job.batches
    assert (batches.world_size, batches.model_parallel) == (replicas, model_parallel)
    assert batches.global_batch == 32 * replicas


def test_eight_gpus_one_process_each_and_a_model_axis_of_four_make_four_replicas():
    batches = planned({"model_parallel": "4"}, gpu_count=4, environ=ENV).job.batches
    assert (batches.world_size, batches.global_batch) == (2, 64)


def test_a_model_axis_that_does_not_divide_the_devices_is_refused_before_anything_starts():
    with pytest.raises(ConfigError, match=r"model_parallel=3 does not divide the job's 4 device"):
        planned({"model_parallel": "3"})
    with pytest.raises(ConfigError, match=r"does not divide the job's 2 device.*use one of 1, 2"):
        planned({"model_parallel": "4"}, environ=ENV)  # one CPU device per process


def test_model_parallel_on_horovod_is_refused_naming_backend_jax():
    the_job = job(["algo-1"], "algo-1", {"model_parallel": "2"})
    with pytest.raises(ConfigError, match=r"set backend=jax .* or model_parallel=1"):
        validate_hyperparameters(the_job.hyperparameters, ENV)
