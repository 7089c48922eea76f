"""The checkpoint folder's layout, and which checkpoint a (re)started job resumes from.

Rank 0 writes (train.checkpoints) and reads back when a job starts; the launcher reads the same
folder when a job is stopped, to tell in the failure file which checkpoint a restart will use
(container.supervisor). Both pick it here, with `newest_usable`, so the two can never disagree;
this module imports no TensorFlow, which the launcher does not load.

Layout: one folder per checkpoint, `epoch-NNNNNN` (epochs done), `epoch-NNNNNN.K` for the K-th
later copy of the same epoch (a stop mid-epoch, a save by the clock), each holding `state.json`
(written last, so its presence means a complete write) beside the variables.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATE = "state.json"
PREFIX = "epoch-"
_NAME = re.compile(re.escape(PREFIX) + r"(?P<epochs>\d+)(?:\.(?P<again>\d+))?$")


def is_checkpoint_name(name: str) -> bool:
    return _NAME.match(name) is not None


def order(folder: Path) -> tuple[int, int]:
    """Sorts checkpoint folders oldest first: by epochs done, then by copy (`.9` before `.10`)."""
    found = _NAME.match(folder.name)
    if found is None:
        raise ValueError(f"{folder.name} is not a checkpoint folder name ({PREFIX}NNNNNN[.K])")
    return int(found["epochs"]), int(found["again"] or 0)


def complete(directory: Path) -> list[Path]:
    """Folders with a state file, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(
        (p for p in directory.iterdir() if is_checkpoint_name(p.name) and (p / STATE).is_file()),
        key=order,
    )


def read_state(folder: Path) -> dict[str, Any]:
    """A checkpoint's state; ValueError (or OSError) when it cannot be the one resumed from."""
    state = json.loads((folder / STATE).read_text())
    if not isinstance(state, dict) or not isinstance(state.get("epochs_done"), int):
        raise ValueError(f"{STATE} has no integer epochs_done")
    return state


def newest_usable(
    directory: Path,
    restore: Callable[[Path], None] = lambda folder: None,
    log: Callable[[str], None] = lambda line: None,
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint whose state reads and that `restore` (which raises when the
    variables do not read back) accepts, as (folder, state); None if none.

    Newest first, falling back one by one: SageMaker syncs the folder with S3 in the
    background, so a spot reclaim can leave a partial copy. The launcher passes no `restore`
    (it has no model): it names the checkpoint a restart would pick unless that one's variables
    turn out to be torn.
    """
    for folder in reversed(complete(directory)):
        try:
            state = read_state(folder)
            restore(folder)
            return folder, state
        except Exception as error:  # TensorFlow reports a torn file as IndexError,
            # DataLossError, NotFoundError or AssertionError, depending on what is missing
            reason = f"{type(error).__name__}: {error}".replace("\n", " ")[:300]
            log(
                f"skipped checkpoint {folder}, it cannot be read back ({reason}); "
                f"trying an older one"
            )
    return None
