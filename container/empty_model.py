"""A script-mode job that completed without saving a model: say so where the user looks.

A script that saves its model anywhere but SM_MODEL_DIR (a keras.io guide's `./ckpt`) ends
with exit code 0, SageMaker reports the job Completed and uploads an empty model.tar.gz, and
the first sign of the mistake is an endpoint that cannot load it. The launcher on the leader
checks the model folder when a script-mode job completes (the built-in trainer always writes
a model; rank 0, which saves in a script, runs on the leader) and warns without failing the
job, since a script may keep its results elsewhere on purpose:

in the log and in /opt/ml/output/data/WARNING-empty-model.txt (job.notices says why there).
Not in the model folder itself: a file there would make the artifact non-empty and hide the
very symptom from `serve`.

The warning names the way out (save into SM_MODEL_DIR) and what the script left in its
working folder (/opt/ml/code) that looks like a model, written during this job: a look at a
bounded number of entries, so a code folder holding a dataset costs nothing.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

from container.logs import log
from job import notices
from job.paths import MlPaths

WARNING_FILE = "WARNING-empty-model.txt"
# Keras' .keras, .h5 and .weights.h5 files, a SavedModel, tf.train.Checkpoint's files.
MODEL_LIKE = re.compile(
    r"\.(keras|h5|hdf5|ckpt|index)$|\.data-\d+-of-\d+$|^saved_model\.pb$|"
    r"^checkpoint$"
)
SCAN_LIMIT = 5000  # entries of the code folder looked at
SHOWN = 4  # names of model-like files in the warning


def is_empty(model_dir: Path) -> bool:
    """No file anywhere under the folder (empty sub-folders are still an empty model)."""
    return not any(files for _, _, files in os.walk(model_dir))


def model_like_files(code_dir: Path, since: float) -> list[str]:
    """Files under `code_dir` (relative to it, sorted) written at or after `since` whose names
    look like a saved model or checkpoint; the first SCAN_LIMIT entries are looked at."""
    entries = ((Path(folder), name) for folder, _, files in os.walk(code_dir) for name in files)
    found = []
    for folder, name in itertools.islice(entries, SCAN_LIMIT):
        path = folder / name
        if MODEL_LIKE.search(name) and path.stat().st_mtime >= since:
            found.append(str(path.relative_to(code_dir)))
    return sorted(found)


def warning_text(model_dir: Path, code_dir: Path, left: list[str]) -> str:
    """What to tell a user whose job saved no model: the symptom, the fix, and the files
    that look like the model it meant to save."""
    text = (
        f"the job completed but saved no model: {model_dir} is empty, so the job's "
        'model.tar.gz is empty. Save the model into os.environ["SM_MODEL_DIR"] '
        f'({model_dir}), e.g. model.save(os.path.join(os.environ["SM_MODEL_DIR"], '
        '"model"))'
    )
    if not left:
        return text + "."
    more = f" and {len(left) - SHOWN} more" if len(left) > SHOWN else ""
    return (
        f"{text}. The script left these in its working folder {code_dir}: "
        f"{', '.join(left[:SHOWN])}{more}."
    )


def warn_if_empty(paths: MlPaths, since: float) -> None:
    """Warn in the log and in the output data folder (job.notices) when the model folder is
    empty; a file system that cannot be read here changes nothing but the warning."""
    try:
        if not is_empty(paths.model_dir):
            return
        text = warning_text(
            paths.model_dir, paths.code_dir, model_like_files(paths.code_dir, since)
        )
    except OSError as error:
        log.warning(f"cannot check the model folder {paths.model_dir}: {error.strerror or error}")
        return
    notices.warn(paths, WARNING_FILE, text, "launcher")
