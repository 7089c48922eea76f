"""Checkpoints that survive a kill at any moment, and resuming from the newest one.

Rank 0 writes each checkpoint into a temporary folder, records the state last, and renames the
folder into place: a rename is atomic, so a folder named `epoch-NNNNNN` is always complete and
a torn `.tmp-*` folder left by a kill is ignored and removed on the next start. Names carry no
host, because only rank 0 writes (SageMaker merges every host's /opt/ml/checkpoints in S3).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import tensorflow as tf

STATE = "state.json"
PREFIX = "epoch-"


class CheckpointStore:
    def __init__(self, directory: Path, keep: int):
        self.directory = directory
        self.keep = keep

    def _complete(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.glob(f"{PREFIX}*") if (p / STATE).is_file())

    def latest(self) -> tuple[Path, dict] | None:
        complete = self._complete()
        if not complete:
            return None
        return complete[-1], json.loads((complete[-1] / STATE).read_text())

    def clean_torn(self) -> None:
        for torn in self.directory.glob(".tmp-*"):
            shutil.rmtree(torn, ignore_errors=True)

    def save(self, checkpoint: tf.train.Checkpoint, epochs_done: int, **state) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{PREFIX}{epochs_done:06d}"
        temporary = self.directory / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(temporary, ignore_errors=True)
        checkpoint.write(str(temporary / "ckpt"))
        (temporary / STATE).write_text(json.dumps({"epochs_done": epochs_done, **state}))
        if final.exists():  # the same epoch saved again (a stop mid-epoch, then a resume)
            shutil.rmtree(final)
        os.replace(temporary, final)
        for old in self._complete()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    @staticmethod
    def restore(checkpoint: tf.train.Checkpoint, folder: Path) -> None:
        checkpoint.read(str(folder / "ckpt")).assert_existing_objects_matched()
