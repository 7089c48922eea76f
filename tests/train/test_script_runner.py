"""Script mode's check that a script's processes trained one model, not one each
(train/apart.py). The verdict on what the stacks reported is pure and tested here; real
processes of real jobs are in tests/train/test_trained_apart.py (TensorFlow) and, for JAX,
tests/image/test_keras_jax.py (the TensorFlow 2.21 image)."""

import pytest

from job.errors import ConfigError
from job.protocol import FailureKind, exit_code
from train.apart import Joined, TrainedApart, verdict


@pytest.mark.parametrize(
    "world_size, joined",
    [
        (1, Joined(jax=1, tf_strategy="MirroredStrategy", tensorflow=True)),  # one process alone
        (2, Joined()),  # no framework at all
        (2, Joined(jax=2, tensorflow=True)),  # keras.distribution over both
        (2, Joined(tf_workers=2, tf_strategy="MultiWorkerMirroredStrategy", tensorflow=True)),
        (4, Joined(horovod=4, tensorflow=True)),
        # the one-host strategy beside one that spans the job (evaluation, say)
        (2, Joined(tf_workers=2, tf_strategy="MirroredStrategy", tensorflow=True)),
        (2, Joined(horovod=2, tf_strategy="MirroredStrategy", tensorflow=True)),
    ],
)
def test_processes_that_trained_together_are_left_alone(world_size, joined):
    assert verdict(world_size, joined, mwms=True) is None


def test_jax_that_ran_without_the_others_fails_the_job():
    """keras.io's guide hides a failed keras.distribution.initialize() in a try/except."""
    said = verdict(4, Joined(jax=1), mwms=True)
    assert said.fails
    assert said.text.startswith(
        "this job has 4 processes, but the script's JAX ran with 1: "
        "each process trained its own model. Call "
        "keras.distribution.initialize() with no arguments"
    ), said.text


def test_tf_keras_on_jax_under_mwms_fails_naming_the_backend():
    """The AWS SDK's MWMS test script with its tf.keras made Keras 3 on JAX: the strategy
    reports every host's replicas while each host's JAX trains alone."""
    joined = Joined(jax=1, tf_workers=2, tf_strategy="MultiWorkerMirroredStrategy", tensorflow=True)
    said = verdict(2, joined, mwms=True)
    assert said.fails
    assert said.text.startswith(
        "this job has 2 processes and the script's MultiWorkerMirroredStrategy spans 2 "
        "workers, but its Keras ran on JAX with 1: the strategy does not drive JAX"
    ), said.text
    assert (
        "Build the model with tf.keras as tf_keras (TF_USE_LEGACY_KERAS=1, the default) "
        "under the strategy, or drop the strategy and call keras.distribution.initialize()"
        in said.text
    )


@pytest.mark.parametrize(
    "mwms, fix",
    [
        (
            True,
            "use tf.distribute.MultiWorkerMirroredStrategy(), for which TF_CONFIG is set in "
            "every process",
        ),
        (
            False,
            "synchronise with Horovod (horovod.tensorflow.keras, or `from train import "
            "distributed`)",
        ),
    ],
)
def test_the_one_host_mirrored_strategy_on_several_processes_fails_naming_the_fix(mwms, fix):
    """keras.io's "Multi-GPU distributed training with TensorFlow" guide, run on 2 hosts."""
    said = verdict(2, Joined(tf_strategy="MirroredStrategy", tensorflow=True), mwms=mwms)
    assert said.fails
    assert said.text.startswith(
        "this job has 2 processes, but the script's tf.distribute."
        "MirroredStrategy spans the devices of one process only"
    ), said
    assert said.text.endswith(f"To train one model across them, {fix}, or train on one instance")


def test_a_multi_worker_strategy_of_fewer_workers_fails():
    joined = Joined(tf_workers=1, tf_strategy="MultiWorkerMirroredStrategy", tensorflow=True)
    said = verdict(2, joined, mwms=True)
    assert said.fails and said.text == (
        "this job has 2 processes, but the script's MultiWorkerMirroredStrategy spans 1 of "
        "them: each group trained its own model. Leave TF_CONFIG as the launcher sets it"
    )


def test_a_framework_synchronised_through_nothing_known_is_a_warning():
    said = verdict(2, Joined(tensorflow=True), mwms=False)
    assert not said.fails
    assert said.text.startswith(
        "this job has 2 processes, but the script synchronised them "
        "with none of MultiWorkerMirroredStrategy, Horovod or "
        "keras.distribution"
    ), said.text


def test_trained_apart_is_a_configuration_error():
    """Restarting would train apart again: the job ends with the configuration error's code,
    and is never restarted (container.restarts)."""
    error = TrainedApart("x")
    assert isinstance(error, ConfigError) and error.kind is FailureKind.CONFIG
    assert error.exit_code == exit_code(FailureKind.CONFIG) == 2
