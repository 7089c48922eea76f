"""The way out of known errors: each hint answers the error as the stacks print it, and
nothing else."""

import pytest

from job.hints import (
    HINT_LIMIT,
    HINTS,
    KERAS3_UNDER_MWMS,
    NO_HOROVOD,
    NO_JAX,
    OUT_OF_MEMORY,
    hint_for,
)

PER_REPLICA = (
    "ValueError: Attempt to convert a value (PerReplica:{ 0: <tf.Tensor: shape=(64, 10), "
    "dtype=float32, numpy= array([[0.1, 0.2]], dtype=float32)> }) with an unsupported type "
    "(<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor."
)


@pytest.mark.parametrize(
    "error, hint",
    [
        (PER_REPLICA, KERAS3_UNDER_MWMS),
        ("ModuleNotFoundError: No module named 'horovod'", NO_HOROVOD),
        ("ModuleNotFoundError: No module named 'horovod.tensorflow.keras'", NO_HOROVOD),
        (
            "ResourceExhaustedError: Graph execution error: Detected at node dense/MatMul "
            "OOM when allocating tensor with shape[8192,4096] and type float",
            OUT_OF_MEMORY,
        ),
        ("InternalError: OOM when allocating tensor with shape[1024]", OUT_OF_MEMORY),
        ("ModuleNotFoundError: No module named 'jax'", NO_JAX),
    ],
)
def test_a_known_error_gets_its_way_out(error, hint):
    assert hint_for(error) == hint


@pytest.mark.parametrize(
    "error",
    [
        "ValueError: column 7 holds text where a number was expected",
        "ModuleNotFoundError: No module named 'horovodx'",
        "TypeError: PerReplica objects are not iterable",  # PerReplica, but not Keras 3's fit
        "MemoryError",  # the host's memory, not the device's: no batch hyperparameter helps
    ],
)
def test_an_unknown_error_gets_no_hint(error):
    assert hint_for(error) is None


def test_every_hint_is_short():
    assert all(len(hint.encode()) <= HINT_LIMIT for _, hint in HINTS)
