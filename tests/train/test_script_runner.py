"""Script mode's check that a script's JAX ran with every process of the job
(train/script_runner.py; a real 2-host job on the image: tests/image/test_keras_jax.py)."""

from train.script_runner import trained_alone


def test_a_script_whose_jax_ran_without_the_others_is_named():
    assert trained_alone(2, None) is None  # the script never imported JAX
    assert trained_alone(2, 2) is None and trained_alone(1, 1) is None
    said = trained_alone(4, 1)
    assert said.startswith("this job has 4 processes, but the script's JAX ran with 1: each "
                           "process trained on its own"), said
    assert "keras.distribution.initialize() with no arguments" in said
