"""Exact resume's arithmetic and the training stream it rebuilds (in-process, no mpirun)."""

import numpy as np
import pytest

from job.trainer_config import TrainerConfig
from train.data import list_channel
from train.pipeline import label_lookup, open_source, training_input
from train.position import JobPosition, stream_start
from train.sharding import Share


def test_a_position_advances_across_epochs_and_round_trips_through_a_checkpoint_state():
    start = JobPosition(0, 0, 0)
    later = start.after(25, global_batch=8, steps_per_epoch=10)
    assert later == JobPosition(2, 5, 200)
    state = {"epochs_done": later.epochs_done, **later.counts(8)}
    assert JobPosition.from_state(state, global_batch=8, steps_per_epoch=10) == later
    assert later.describe() == "epoch 3, step 6" and start.describe() == "epoch 1"


def test_another_global_batch_keeps_the_epoch_and_its_samples_and_old_states_resume_at_epoch_start():
    state = {"epochs_done": 2, **JobPosition(2, 6, 300).counts(16)}  # 96 samples into epoch 3
    assert JobPosition.from_state(state, global_batch=32, steps_per_epoch=5) == JobPosition(
        2, 3, 300
    )
    assert JobPosition.from_state(state, global_batch=4, steps_per_epoch=20) == JobPosition(
        2, 19, 300
    )
    assert JobPosition.from_state({"epochs_done": 3}, 16, 10) == JobPosition(3, 0, 480)


@pytest.mark.parametrize(
    "samples_done, world_size, share, start",
    [(0, 2, 50, (0, 0)), (160, 2, 50, (1, 30)), (100, 2, 50, (1, 0)), (160, 4, 17, (2, 6))],
)
def test_a_rank_continues_its_stream_at_its_part_of_the_samples_done(
    samples_done, world_size, share, start
):
    assert stream_start(samples_done, world_size, share) == start


def stream(folder, start, batch=4, passes=None):
    channel = list_channel("train", folder, "")
    table = open_source(channel, Share(channel.files), TrainerConfig())
    dataset = training_input(
        table,
        label_lookup(list(range(3))),
        batch,
        TrainerConfig(shuffle_buffer=7),
        seed=11,
        augment=False,
        start=start,
    )
    return np.concatenate([x[:, 0] for x, _ in dataset.take(passes).as_numpy_iterator()])


def test_the_stream_rebuilt_at_any_position_continues_it_exactly_across_passes(tmp_path):
    for index in range(5):  # 5 files of 6 rows: a pass is 30 samples
        rows = "\n".join(f"{row % 3},{index * 6 + row}" for row in range(6))
        (tmp_path / f"{index}.csv").write_text(rows + "\n")
    whole = stream(tmp_path, (0, 0), passes=30)  # 120 samples: 4 passes
    assert sorted(whole[:30]) == list(range(30)) and sorted(whole[30:60]) == list(range(30))
    assert list(whole[:30]) != list(whole[30:60])  # each pass in its own order
    for samples_done in (4, 28, 32, 61):
        resumed = stream(tmp_path, stream_start(samples_done, 1, 30), passes=10)
        assert list(resumed) == list(whole[samples_done : samples_done + 40]), samples_done


@pytest.mark.parametrize("global_seed", [0, 5])
def test_the_stream_depends_on_its_seed_alone_and_a_global_seed_of_0_is_allowed(
    tmp_path, global_seed
):
    """seed=0 makes the trainer set TensorFlow's global seed to 0, under which TF 2.15 once
    raised OperatorNotAllowedInGraphError while building a pass with a tensor seed."""
    import tensorflow as tf

    for index in range(2):
        (tmp_path / f"{index}.csv").write_text(
            "".join(f"{r % 3},{index * 6 + r}\n" for r in range(6))
        )
    tf.random.set_seed(None)
    reference = stream(tmp_path, (0, 0), passes=6)
    tf.random.set_seed(global_seed)
    try:
        assert list(stream(tmp_path, (0, 0), passes=6)) == list(reference)
    finally:
        tf.random.set_seed(None)
