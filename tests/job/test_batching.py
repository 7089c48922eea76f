import pytest

from job.batching import plan_batches
from job.errors import ConfigError
from train.schedule import warmup_rate


def plan(**overrides):
    values = dict(
        world_size=8,
        global_batch_size=0,
        per_device_batch_size=32,
        max_device_batch_size=256,
        learning_rate=0.1,
        base_batch_size=256,
        scale_learning_rate=True,
    )
    values.update(overrides)
    return plan_batches(**values)


def test_per_device_batch_scales_global_batch_and_learning_rate_linearly():
    result = plan()
    assert (result.global_batch, result.per_device_batch, result.accumulation_steps) == (256, 32, 1)
    assert result.learning_rate == pytest.approx(0.1)
    assert plan(world_size=16).learning_rate == pytest.approx(0.2)


def test_fixed_global_batch_gives_same_optimisation_on_any_device_count():
    for world_size, micro, steps in [(1, 256, 8), (2, 256, 4), (8, 256, 1), (64, 32, 1)]:
        result = plan(world_size=world_size, global_batch_size=2048)
        assert result.global_batch == 2048 and result.learning_rate == pytest.approx(0.8)
        assert (result.micro_batch, result.accumulation_steps) == (micro, steps)
        assert result.micro_batch * result.accumulation_steps * world_size == 2048


def test_accumulation_steps_divide_the_per_device_batch():
    result = plan(world_size=1, global_batch_size=300, max_device_batch_size=128)
    assert (result.accumulation_steps, result.micro_batch) == (3, 100)
    result = plan(world_size=1, global_batch_size=7, max_device_batch_size=2)
    assert (result.accumulation_steps, result.micro_batch) == (7, 1)


def test_uneven_global_batch_says_which_multiples_work():
    with pytest.raises(
        ConfigError,
        match="global_batch_size=100 cannot be split evenly over 8 "
        "devices; use a multiple of 8, e.g. 96 or 104",
    ):
        plan(global_batch_size=100)


def test_no_scaling_keeps_the_rate_and_derivation_is_printed():
    result = plan(scale_learning_rate=False, global_batch_size=1024)
    assert result.learning_rate == 0.1
    assert result.derivation() == (
        "global batch 1024 = 8 device(s) x 1 accumulated "
        "micro-batch(es) x 128; learning rate 0.1 x 1024/base batch = 0.1"
    )


def test_warmup_ramps_linearly_then_holds():
    rates = [warmup_rate(step, start=0.1, target=0.8, warmup_steps=7) for step in (0, 1, 7, 100)]
    assert rates == pytest.approx([0.1, 0.2, 0.8, 0.8])
    assert warmup_rate(0, start=0.1, target=0.8, warmup_steps=0) == 0.8
