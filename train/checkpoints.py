"""Checkpoints that survive a kill at any moment, and resuming from the newest usable one.

Rank 0 writes each checkpoint into a temporary folder, records the state last, and renames the
folder into place: a rename is atomic, so a folder named `epoch-NNNNNN` holds a complete write
and a torn `.tmp-*` folder left by a kill is ignored and removed on the next start. The same
epoch saved again (a stop mid-epoch, then a resume; checkpoints every few minutes inside a long
epoch) goes to `epoch-NNNNNN.K`, K one more than any copy of that epoch there, and the older
folder is pruned only after it is in place: at no moment is there no checkpoint.

What was written completely can still arrive broken: SageMaker syncs /opt/ml/checkpoints
with S3 in the background, so a spot reclaim can leave a partial copy (a state file without
its variables, a truncated variables file). `resume` therefore tries the newest folder first
and falls back, one by one, to older ones, logging which it skipped and why. Names carry no
host, because only rank 0 writes (SageMaker merges every host's checkpoints in S3).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from job.checkpoint_folders import PREFIX, STATE, complete, is_checkpoint_name, newest_usable, order


class CheckpointStore:
    def __init__(self, directory: Path, keep: int):
        self.directory = directory
        self.keep = keep

    def clean_torn(self) -> None:
        for torn in self.directory.glob(".tmp-*"):
            shutil.rmtree(torn, ignore_errors=True)

    def save(self, checkpoint: tf.train.Checkpoint, epochs_done: int, **state) -> Path:
        final = self.next_folder(epochs_done)
        temporary = self.directory / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(temporary, ignore_errors=True)
        checkpoint.write(str(temporary / "ckpt"))
        (temporary / STATE).write_text(json.dumps({"epochs_done": epochs_done, **state}))
        os.replace(temporary, final)
        self.prune()
        return final

    def next_folder(self, epochs_done: int) -> Path:
        """The name the next checkpoint of `epochs_done` epochs takes (the folder made ready):
        after the copies of this epoch already there, even once older ones were pruned, since
        a reused lower number would sort as the oldest and be pruned at once."""
        self.directory.mkdir(parents=True, exist_ok=True)
        copies = [
            order(p)[1]
            for p in self.directory.iterdir()
            if is_checkpoint_name(p.name) and order(p)[0] == epochs_done
        ]
        again = max(copies) + 1 if copies else 0
        return self.directory / (f"{PREFIX}{epochs_done:06d}" + (f".{again}" if again else ""))

    def confirm(self, folder: Path, epochs_done: int, **state) -> None:
        """Write the state of a checkpoint whose variables are in `folder` already (a sharded
        checkpoint, written by every process into its own host's folder): written aside and
        renamed, it makes the folder count (job.checkpoint_folders.complete)."""
        partial = folder / f".{STATE}.partial"
        partial.write_text(json.dumps({"epochs_done": epochs_done, **state}))
        os.replace(partial, folder / STATE)

    def prune(self) -> list[str]:
        """Remove all but the `keep` newest complete checkpoints; the names removed."""
        old = complete(self.directory)[: -self.keep]
        for folder in old:
            shutil.rmtree(folder, ignore_errors=True)
        return [folder.name for folder in old]

    def resume(
        self, checkpoint: tf.train.Checkpoint, log: Callable[[str], None]
    ) -> tuple[Path, dict] | None:
        """Restore the newest checkpoint that reads back; (folder, state), or None if none.
        The pick is job.checkpoint_folders', the one the launcher names after a stop."""
        return newest_usable(self.directory, lambda folder: self.restore(checkpoint, folder), log)

    @staticmethod
    def restore(checkpoint: tf.train.Checkpoint, folder: Path) -> None:
        checkpoint.read(str(folder / "ckpt")).assert_existing_objects_matched()


class ArrayCheckpoint:
    """tf.train.Checkpoint's write and read for Keras 3 on JAX, whose variables TensorFlow's
    checkpoint cannot hold: the whole of every variable (train.sync.gathered_value: with a
    model split across processes gathered, so every process writes, Sync.saves_on_every_rank),
    in their fixed order, in one .npz. `read` checks the count and shapes and keeps the
    values in `loaded` without assigning them: JAX assigns a variable that spans processes
    only in step with every process (it checks that they all assign the same value), and rank
    0 reads alone; every rank assigns them when rank 0 broadcasts them (train.sync)."""

    def __init__(self, variables: list):
        self.variables = variables
        self.loaded: list[np.ndarray] | None = None

    def write(self, prefix: str) -> None:
        from train.sync import gathered_value

        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
        np.savez(f"{prefix}.npz", *[gathered_value(v) for v in self.variables])

    def read(self, prefix: str) -> ArrayCheckpoint:
        with np.load(f"{prefix}.npz") as arrays:
            values = [arrays[f"arr_{index}"] for index in range(len(arrays.files))]
        shapes = [tuple(v.shape) for v in self.variables]
        if [value.shape for value in values] != shapes:
            raise ValueError(
                f"it holds {len(values)} arrays that do not match the model's and "
                f"optimizer's {len(shapes)} variables"
            )
        self.loaded = values
        return self

    def assert_existing_objects_matched(self) -> ArrayCheckpoint:
        return self  # read checked them


def loaded_values(checkpoint: tf.train.Checkpoint | ArrayCheckpoint) -> list | None:
    """The values a checkpoint read but did not assign (ArrayCheckpoint), else None."""
    return checkpoint.loaded if isinstance(checkpoint, ArrayCheckpoint) else None


def variables_checkpoint(model, optimizer, arrays: bool) -> tf.train.Checkpoint | ArrayCheckpoint:
    """What a checkpoint holds: the model's and its optimizer's variables; as arrays for Keras
    3 on JAX (`arrays`), whose variables TensorFlow's Checkpoint cannot track."""
    if arrays:
        return ArrayCheckpoint(model.variables + optimizer.variables)
    return tf.train.Checkpoint(model=model, optimizer=optimizer)
