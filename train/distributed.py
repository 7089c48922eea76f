"""A few lines that make a plain Keras script distributed (script mode).

    from train import distributed

    distributed.init()                                   # Horovod; one GPU per rank
    x, y = distributed.shard(x, y)                       # this rank's share of the data
    optimizer = distributed.optimizer(
        tf.keras.optimizers.Adam(distributed.scale_learning_rate(1e-3)))
    model.compile(optimizer=optimizer, loss=..., metrics=[...])
    model.fit(x, y, callbacks=distributed.callbacks(), verbose=distributed.verbose())
    distributed.export(model, classes=class_names)       # rank 0: SavedModel + metadata.json

`callbacks()` broadcasts rank 0's initial weights, averages the epoch metrics over ranks,
stops every rank together when the job is asked to stop (SIGTERM on SageMaker), so a script
that uses it ends cleanly within SageMaker's grace period, and reports each finished step to
the launcher's watchdog (`heartbeat()` does that for a script's own loop). The built-in
trainer uses the same start-up, optimizer (one micro-batch per step) and stop callback; it accumulates micro-batches
in its own training step instead (train/accumulation.py says why). `export` writes the model
as the built-in trainer does; a script that calls model.save(SM_MODEL_DIR/...) instead is
served too, as raw outputs with no class labels.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import horovod.tensorflow.keras as hvd
import tensorflow as tf

from job.paths import MlPaths
from train.callbacks import ReportProgress, StopOnRequest
from train.export import export_model
from train.progress import Progress
from train.runtime import start_horovod


def init() -> None:
    start_horovod()


def rank() -> int:
    return hvd.rank()


def size() -> int:
    return hvd.size()


def is_leader() -> bool:
    return hvd.rank() == 0


def verbose() -> int:
    """Keras verbosity: progress from rank 0 only."""
    return 2 if hvd.rank() == 0 else 0


def shard(*arrays):
    """Rank r of W keeps samples r, r+W, ... of each array (for data every rank loaded)."""
    shares = [array[hvd.rank() :: hvd.size()] for array in arrays]
    return shares[0] if len(shares) == 1 else shares


def scale_learning_rate(learning_rate: float) -> float:
    """Linear scaling: W ranks with the same per-rank batch take W times bigger steps."""
    return learning_rate * hvd.size()


def optimizer(
    inner: tf.keras.optimizers.Optimizer,
    *,
    accumulation_steps: int = 1,
    fp16_allreduce: bool = False,
) -> tf.keras.optimizers.Optimizer:
    """Gradients averaged over ranks (and over `accumulation_steps` micro-batches first)."""
    return hvd.DistributedOptimizer(
        inner,
        backward_passes_per_step=accumulation_steps,
        average_aggregated_gradients=True,  # k micro-batches = one batch k times bigger
        compression=hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none,
    )


def callbacks(*, accumulation_steps: int = 1) -> list[tf.keras.callbacks.Callback]:
    return [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        StopOnRequest(accumulation_steps),
        ReportProgress(accumulation_steps),
    ]


def heartbeat(step: int | None = None) -> None:
    """Tell the launcher's watchdog this rank is alive (`progress_timeout`): for a script with
    its own loop, or long work between prints. A line on stdout counts too; stderr does not
    (TensorFlow and Horovod warn there while a job hangs)."""
    Progress.report(step)


def export(
    model: tf.keras.Model,
    *,
    classes: Sequence[Any] | None = None,
    model_dir: str | os.PathLike | None = None,
) -> Path | None:
    """On rank 0, write `model` for serving as the built-in trainer does: a portable SavedModel
    (serving_default signature) in <model_dir>/model/1 and metadata.json, with `classes` the
    labels of a classifier's output columns (None: outputs are served raw). `model_dir` is
    SM_MODEL_DIR by default. Other ranks write nothing and get None."""
    if hvd.rank() != 0:
        return None
    target = Path(model_dir or os.environ.get("SM_MODEL_DIR") or MlPaths().model_dir)
    return export_model(model, target, classes=classes)
