"""How a rank gives `jax.distributed.initialize` the launcher's heartbeat (train.jax_heartbeat).

This venv has no JAX: the wrapper is checked here around a function with the signature of
JAX 0.10.2's `jax.distributed.initialize`. The hook itself, in real JAX processes of which one
is frozen (script mode's import hook and the built-in trainer's call), is in
tests/image/test_keras_jax.py, with the whole job whose watchdog names the frozen process.
"""

from __future__ import annotations

import pytest

from job.errors import ConfigError
from job.launch_config import JAX_HEARTBEAT_ENV
from train.jax_heartbeat import planned_seconds, with_heartbeat


def initialize(
    coordinator_address=None,
    num_processes=None,
    process_id=None,
    local_device_ids=None,
    cluster_detection_method=None,
    initialization_timeout=300,
    heartbeat_timeout_seconds=100,
    shutdown_timeout_seconds=300,
    coordinator_bind_address=None,
    slice_index=None,
    partition_index=None,
):
    """jax.distributed.initialize's signature (JAX 0.10.2); answers the heartbeat it got."""
    return heartbeat_timeout_seconds


def wrapped(seconds=1860):
    said = []
    return with_heartbeat(initialize, seconds, lambda *args: said.append(args)), said


def test_keras_call_without_a_heartbeat_gets_the_planned_one_and_says_so():
    """keras.distribution.initialize() passes these three and nothing else."""
    call, said = wrapped()
    assert call(coordinator_address="algo-1:7777", num_processes=2, process_id=1) == 1860
    assert said == [(1860, 100)]  # (what was set, JAX's own default)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((), {"heartbeat_timeout_seconds": 30}),
        (("algo-1:7777", 2, 0, None, None, 300, 30), {}),  # the 7th positional argument
    ],
)
def test_a_heartbeat_the_script_passes_is_kept_and_nothing_is_said(args, kwargs):
    call, said = wrapped()
    assert call(*args, **kwargs) == 30
    assert said == []


def test_a_call_jax_refuses_reaches_jax_as_it_is():
    call, _ = wrapped()
    with pytest.raises(TypeError, match="unexpected keyword argument 'heartbeat'"):
        call(heartbeat=5)


def test_a_jax_without_the_parameter_is_left_alone():
    def old_initialize(coordinator_address=None, num_processes=None, process_id=None):
        return "old"

    assert with_heartbeat(old_initialize, 1860, print) is old_initialize


@pytest.mark.parametrize("text, seconds", [("", None), ("1860", 1860), (" 180\n", 180)])
def test_the_planned_heartbeat_is_read_from_the_ranks_environment(text, seconds):
    assert planned_seconds({JAX_HEARTBEAT_ENV: text} if text else {}) == seconds


@pytest.mark.parametrize("text", ["0", "-5", "1860.5", "long"])
def test_a_heartbeat_that_is_no_whole_number_of_seconds_is_a_configuration_error(text):
    with pytest.raises(ConfigError) as raised:
        planned_seconds({JAX_HEARTBEAT_ENV: text})
    assert str(raised.value).startswith(
        f"{JAX_HEARTBEAT_ENV}={text!r} is not a whole number of seconds of at least 1; the "
        "launcher sets it from progress_timeout: remove the `-x` that overrides it"
    )
