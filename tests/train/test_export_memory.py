"""What the built-in trainer holds whole when it writes a checkpoint (docs/model-parallel.md,
"What a process holds"): a checkpoint's .npz is written one variable at a time. Counted, not
measured: a memory threshold would be flaky; the number of whole values alive at once is not."""

from __future__ import annotations

import types
import weakref
from pathlib import Path

import numpy as np

from train.checkpoints import ArrayCheckpoint


class Counted:
    """A variable whose whole value (`numpy()`, as train.sync.local_value reads a variable
    that is no JAX array) is a fresh array each time, counted while it lives."""

    alive = 0
    most = 0

    def __init__(self, value: np.ndarray):
        self.value_ = value
        self.shape = value.shape

    def numpy(self) -> np.ndarray:
        whole = self.value_.copy()
        Counted.alive += 1
        Counted.most = max(Counted.most, Counted.alive)
        weakref.finalize(whole, Counted.release)
        return whole

    @staticmethod
    def release() -> None:
        Counted.alive -= 1


def test_checkpoint_write_holds_one_whole_variable_at_a_time(tmp_path: Path) -> None:
    values = [np.arange(12, dtype=np.float32).reshape(3, 4) * k for k in range(5)]
    values.append(np.array(7, dtype=np.int64))  # a scalar, as an optimizer's iteration count
    Counted.alive = Counted.most = 0
    ArrayCheckpoint([Counted(v) for v in values]).write(str(tmp_path / "ckpt"))
    assert Counted.most == 1  # np.savez(*all values) held all 6 at once

    # the same .npz as np.savez's: np.load names and reads every array back exactly
    with np.load(tmp_path / "ckpt.npz") as stored:
        assert stored.files == [f"arr_{i}" for i in range(len(values))]
        for index, value in enumerate(values):
            np.testing.assert_array_equal(stored[f"arr_{index}"], value)
            assert stored[f"arr_{index}"].dtype == value.dtype
    read = ArrayCheckpoint([types.SimpleNamespace(shape=v.shape) for v in values])
    read.read(str(tmp_path / "ckpt"))
    assert read.loaded is not None
    for loaded, value in zip(read.loaded, values):
        np.testing.assert_array_equal(loaded, value)
