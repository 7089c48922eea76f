"""Checkpoint files: atomic, pruned, torn ones ignored; the warmup schedule in TensorFlow."""

import numpy as np
import pytest
import tensorflow as tf

from train.checkpoints import CheckpointStore
from train.schedule import WarmupSchedule, warmup_rate


def test_saves_are_atomic_pruned_and_torn_folders_ignored(tmp_path):
    variable = tf.Variable([1.0, 2.0])
    checkpoint = tf.train.Checkpoint(v=variable)
    store = CheckpointStore(tmp_path, keep=2)
    for epoch in (1, 2, 3):
        variable.assign([float(epoch)] * 2)
        store.save(checkpoint, epoch, history={"loss": [0.5] * epoch})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-000002", "epoch-000003"]
    (tmp_path / ".tmp-epoch-000004-99").mkdir()  # killed while writing
    (tmp_path / "epoch-000005").mkdir()  # no state: never completed
    variable.assign([0.0, 0.0])
    folder, state = store.resume(checkpoint, log=pytest.fail)
    assert folder.name == "epoch-000003" and state == {
        "epochs_done": 3,
        "history": {"loss": [0.5] * 3},
    }
    assert variable.numpy().tolist() == [3.0, 3.0]
    store.clean_torn()
    assert not (tmp_path / ".tmp-epoch-000004-99").exists()


def test_resaving_an_epoch_never_leaves_zero_checkpoints(tmp_path):
    variable = tf.Variable(1.0)
    checkpoint = tf.train.Checkpoint(v=variable)
    store = CheckpointStore(tmp_path, keep=1)
    first = store.save(checkpoint, 4)
    variable.assign(2.0)
    second = store.save(checkpoint, 4, interrupted=True)
    # The new save got its own name, so the old one was still there when it landed.
    assert second != first and sorted(p.name for p in tmp_path.iterdir()) == [second.name]
    variable.assign(0.0)
    assert store.resume(checkpoint, log=pytest.fail) == (
        second,
        {"epochs_done": 4, "interrupted": True},
    )
    assert variable.numpy() == 2.0
    assert store.save(checkpoint, 5).name == "epoch-000005"  # a later epoch sorts after both


def test_many_saves_inside_one_epoch_keep_the_newest(tmp_path):
    """Checkpoints every few minutes inside a long epoch: the twelfth save of epoch 1 is the
    one kept and resumed from, not a reused lower number pruned as the oldest."""
    variable = tf.Variable(0.0)
    checkpoint = tf.train.Checkpoint(v=variable)
    store = CheckpointStore(tmp_path, keep=2)
    names = []
    for step in range(1, 13):
        variable.assign(float(step))
        names.append(store.save(checkpoint, 1, step=step).name)
    assert names[-2:] == ["epoch-000001.10", "epoch-000001.11"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names[-2:]
    assert store.resume(checkpoint, log=pytest.fail)[1] == {"epochs_done": 1, "step": 12}
    assert variable.numpy() == 12.0


def truncate_variables(folder):
    data = next(folder.glob("ckpt.data-*"))
    data.write_bytes(data.read_bytes()[:20])


def lose_the_index(folder):  # a partial sync: the state arrived, the variables did not
    (folder / "ckpt.index").unlink()


def break_the_state(folder):
    (folder / "state.json").write_text('{"epochs_done": 3, "hist')


@pytest.mark.parametrize(
    "damage, why",
    [
        (truncate_variables, "IndexError: Read less bytes than requested"),
        (lose_the_index, "NotFoundError: Unsuccessful TensorSliceReader constructor"),
        (break_the_state, "JSONDecodeError: Unterminated string"),
    ],
)
def test_resume_falls_back_past_a_broken_newest_checkpoint(tmp_path, damage, why):
    variable = tf.Variable(np.zeros(1000, np.float32))
    checkpoint = tf.train.Checkpoint(v=variable)
    store = CheckpointStore(tmp_path, keep=3)
    for epoch in (1, 2, 3):
        variable.assign(np.full(1000, epoch, np.float32))
        store.save(checkpoint, epoch)
    damage(tmp_path / "epoch-000003")
    logged = []
    folder, state = store.resume(checkpoint, log=logged.append)
    assert folder.name == "epoch-000002" and state == {"epochs_done": 2}
    assert variable.numpy()[0] == 2.0
    assert len(logged) == 1 and logged[0].startswith(
        f"skipped checkpoint {tmp_path / 'epoch-000003'}"
    )
    assert why in logged[0]


def test_resume_with_nothing_usable_starts_fresh(tmp_path):
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    store = CheckpointStore(tmp_path, keep=1)
    lose_the_index(store.save(checkpoint, 1))
    logged = []
    assert store.resume(checkpoint, log=logged.append) is None
    assert len(logged) == 1
    assert CheckpointStore(tmp_path / "absent", keep=1).resume(checkpoint, log=pytest.fail) is None


@pytest.mark.parametrize("warmup_steps", [0, 1, 10])
def test_schedule_matches_the_formula(warmup_steps):
    schedule = WarmupSchedule(0.1, 0.8, warmup_steps)
    for step in (0, 1, 5, 10, 50):
        assert float(schedule(step)) == pytest.approx(
            warmup_rate(step, start=0.1, target=0.8, warmup_steps=warmup_steps), rel=1e-6
        )
    assert np.isfinite(float(schedule(tf.constant(3, tf.int64))))
