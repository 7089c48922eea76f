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
    folder, state = store.latest()
    assert folder.name == "epoch-000003" and state == {"epochs_done": 3, "history": {"loss": [0.5] * 3}}
    variable.assign([0.0, 0.0])
    CheckpointStore.restore(checkpoint, folder)
    assert variable.numpy().tolist() == [3.0, 3.0]
    store.clean_torn()
    assert not (tmp_path / ".tmp-epoch-000004-99").exists()


def test_resaving_an_epoch_replaces_it(tmp_path):
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    store = CheckpointStore(tmp_path, keep=2)
    store.save(checkpoint, 4)
    store.save(checkpoint, 4, interrupted=True)
    assert store.latest()[1] == {"epochs_done": 4, "interrupted": True}


@pytest.mark.parametrize("warmup_steps", [0, 1, 10])
def test_schedule_matches_the_formula(warmup_steps):
    schedule = WarmupSchedule(0.1, 0.8, warmup_steps)
    for step in (0, 1, 5, 10, 50):
        assert float(schedule(step)) == pytest.approx(
            warmup_rate(step, start=0.1, target=0.8, warmup_steps=warmup_steps), rel=1e-6)
    assert np.isfinite(float(schedule(tf.constant(3, tf.int64))))
