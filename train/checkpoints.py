"""Checkpoints that survive a kill at any moment, and resuming from the newest usable one.

Rank 0 writes each checkpoint into a temporary folder, records the state last, and renames the
folder into place: a rename is atomic, so a folder named `epoch-NNNNNN` holds a complete write
and a torn `.tmp-*` folder left by a kill is ignored and removed on the next start. The same
epoch saved again (a stop mid-epoch, then a resume) goes to `epoch-NNNNNN.K`, a new name, and
the older folder is pruned only after it is in place: at no moment is there no checkpoint.

What was written completely can still arrive broken: SageMaker syncs /opt/ml/checkpoints
with S3 in the background, so a spot reclaim can leave a partial copy (a state file without
its variables, a truncated variables file). `resume` therefore tries the newest folder first
and falls back, one by one, to older ones, logging which it skipped and why. Names carry no
host, because only rank 0 writes (SageMaker merges every host's checkpoints in S3).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable

import tensorflow as tf

STATE = "state.json"
PREFIX = "epoch-"
_NAME = re.compile(re.escape(PREFIX) + r"(?P<epochs>\d+)(?:\.(?P<again>\d+))?$")


def _order(folder: Path) -> tuple[int, int]:
    found = _NAME.match(folder.name)
    return int(found["epochs"]), int(found["again"] or 0)


class CheckpointStore:
    def __init__(self, directory: Path, keep: int):
        self.directory = directory
        self.keep = keep

    def _complete(self) -> list[Path]:
        """Folders with a state file, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted((p for p in self.directory.iterdir()
                       if _NAME.match(p.name) and (p / STATE).is_file()), key=_order)

    def clean_torn(self) -> None:
        for torn in self.directory.glob(".tmp-*"):
            shutil.rmtree(torn, ignore_errors=True)

    def save(self, checkpoint: tf.train.Checkpoint, epochs_done: int, **state) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{PREFIX}{epochs_done:06d}"
        again = 0
        while final.exists():
            again += 1
            final = self.directory / f"{PREFIX}{epochs_done:06d}.{again}"
        temporary = self.directory / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(temporary, ignore_errors=True)
        checkpoint.write(str(temporary / "ckpt"))
        (temporary / STATE).write_text(json.dumps({"epochs_done": epochs_done, **state}))
        os.replace(temporary, final)
        for old in self._complete()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def resume(self, checkpoint: tf.train.Checkpoint,
               log: Callable[[str], None]) -> tuple[Path, dict] | None:
        """Restore the newest checkpoint that reads back; (folder, state), or None if none."""
        for folder in reversed(self._complete()):
            try:
                state = json.loads((folder / STATE).read_text())
                if not isinstance(state, dict) or not isinstance(state.get("epochs_done"), int):
                    raise ValueError(f"{STATE} has no integer epochs_done")
                self.restore(checkpoint, folder)
                return folder, state
            except Exception as error:  # TensorFlow reports a torn file as IndexError,
                # DataLossError, NotFoundError or AssertionError, depending on what is missing
                reason = f"{type(error).__name__}: {error}".replace("\n", " ")[:300]
                log(f"skipped checkpoint {folder}, it cannot be read back ({reason}); "
                    f"trying an older one")
        return None

    @staticmethod
    def restore(checkpoint: tf.train.Checkpoint, folder: Path) -> None:
        checkpoint.read(str(folder / "ckpt")).assert_existing_objects_matched()
