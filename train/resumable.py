"""Checkpoints for users' scripts, on every image: a few lines make a script resume after a
spot interruption, a max-runtime stop or a restart inside the job (`max_restarts`).

    from train.resumable import Checkpoints

    checkpoints = Checkpoints(model)                # after compile; the model built
    start = checkpoints.restore()                   # the newest checkpoint, or a fresh start
    model.fit(x, y, epochs=10, initial_epoch=start.epoch,
              callbacks=[checkpoints.callback()])

or, in a loop of the script's own (every rank calls `after_step` after every optimizer step):

    start = checkpoints.restore()
    for step in range(start.step, steps):
        train_step(batches[step])
        checkpoints.after_step(step=step + 1)

It works with tf.keras + Horovod, tf_keras under MultiWorkerMirroredStrategy and Keras 3 on
JAX (keras.distribution) alike, because it needs nothing of theirs: the leader writes its own
copy of the model's and optimizer's variables (train.sync.local_value: no collective) with the
trainer's torn-proof store (train.checkpoints) into SageMaker's checkpoint folder
(SM_CHECKPOINT_DIR: the job's CheckpointConfig LocalPath, else /opt/ml/checkpoints), and at the
start it reads the newest folder that reads back and sends the values to every rank over MPI,
where each rank assigns them (Keras 3 on JAX assigns a variable that spans processes only with
every process at once).

A model split across hosts (Keras 3 on JAX, a variable some of whose pieces only another
process holds: no process can read it alone) is checkpointed sharded instead, as the built-in
trainer's is (train.checkpoints.ShardedCheckpoints, docs/sharded-checkpoints.md): the leader
names the folder, every process writes its own shards into its own host's copy of it, and
once every process says it wrote them the leader writes `state.json`, so a checkpoint counts
only when all confirmed. At the start the hosts first send each other the shard files they
lack (a restart inside the job; after a new start S3 restored them all), the leader picks the
newest folder whose shards are all there and every process reads its own pieces; one that
cannot be read whole there is an IncompleteCheckpoint (exit code 2, naming what is missing).
Each host prunes its own copies of the folders the leader prunes. Every other model is
checkpointed as above. Each reads the other's checkpoints: a script run again with another
mesh or instance count resumes.

When: after every `every_epochs` epochs, every `every_minutes` of training (so long epochs
lose at most that much), and when the job is asked to stop (SIGTERM on SageMaker): then every
rank agrees on the step (train.agreement), the leader saves, and every rank exits with 143,
the stop's code, so the job is reported stopped, not finished. A `fit` stopped or saved inside
an epoch resumes at that epoch's start with the weights it had: the rest of the epoch's samples
are seen once more, no training is lost.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from job.paths import MlPaths
from job.protocol import stopped_line
from train.agreement import STOP, Cadence, agree_after_step
from train.checkpoints import (
    ArrayCheckpoint,
    CheckpointStore,
    Found,
    ShardedCheckpoints,
    split_across_processes,
)
from train.jax_state import attach_state
from train.logs import log
from train.rank import StopRequest, emit
from train.sync import OverMpi, local_value

STOPPED_CODE = 128 + signal.SIGTERM


def _say(line: str) -> None:
    """A line of the log (train.logs), which the leader alone prints."""
    log.info(f"checkpoints: {line}")


@dataclass(frozen=True)
class Start:
    """Where a script resumes: `epoch` epochs and `step` optimizer steps done, `extra` what the
    script saved beside them, `folder` the checkpoint (None: a fresh start)."""

    epoch: int = 0
    step: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None


class Checkpoints:
    def __init__(
        self,
        model,
        optimizer=None,
        *,
        directory: str | os.PathLike | None = None,
        every_epochs: int = 1,
        every_minutes: float = 30.0,
        keep: int = 2,
    ):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        if self.optimizer is None:
            raise ValueError(
                "Checkpoints(model): compile the model first, or pass the "
                "optimizer your loop uses: Checkpoints(model, optimizer)"
            )
        folder = directory or os.environ.get("SM_CHECKPOINT_DIR") or MlPaths().checkpoint_dir
        self.store = CheckpointStore(Path(folder), keep)
        self.mpi = OverMpi()
        self.every_epochs = every_epochs
        self.cadence = Cadence(every_minutes, leader=self.mpi.rank == 0)
        self.epoch = 0
        self._variables: list | None = None
        self._split: bool | None = None

    def variables(self) -> list:
        """The model's and optimizer's variables, the optimizer's created first (a restore
        comes before the first step, which would create them), in the model's strategy."""
        if self._variables is None:
            if not self.model.built:
                raise ValueError(
                    "Checkpoints: build the model before restoring it (start it "
                    "with an Input layer, or call model.build(input_shape))"
                )
            strategy = getattr(self.model, "distribute_strategy", None)
            with strategy.scope() if strategy is not None else contextlib.nullcontext():
                self.optimizer.build(self.model.trainable_variables)
            self._variables = list(self.model.variables) + list(self.optimizer.variables)
        return self._variables

    def split_across_hosts(self) -> bool:
        """Whether some variable spans other processes' devices (the same answer on every
        process, from the shardings they share): then checkpoints are sharded."""
        if self._split is None:
            self._split = split_across_processes(self.variables())
        return self._split

    def sharded(self) -> ShardedCheckpoints:
        return ShardedCheckpoints(self.store, self.mpi, self.variables())

    def restore(self) -> Start:
        """Every rank calls it, before training: the newest checkpoint's values in every rank's
        variables, and where it was taken; a fresh Start when there is none."""
        StopRequest.arm()  # from here a stop is honoured after a step, with a checkpoint
        if self.split_across_hosts():
            start = self._start(self.sharded().resume(_say))
            self.epoch = start.epoch
            return start
        checkpoint = ArrayCheckpoint(self.variables())
        start = Start()
        if self.mpi.rank == 0:
            self.store.clean_torn()
            found = self.store.resume(checkpoint, _say)
            start = self._start(found)
        start = self.mpi.broadcast_object(start, name="start")
        if start.folder is not None:
            self.mpi.broadcast_variables(self.variables(), checkpoint.loaded)
        self.epoch = start.epoch
        return start

    def save(
        self, *, epoch: int | None = None, step: int | None = None, **extra: Any
    ) -> Path | None:
        """The leader writes a checkpoint: `epoch` epochs done (by default the last one the
        callback saw), `step` optimizer steps (by default the optimizer's count) and `extra`
        (JSON values) for Start.extra. Other ranks write nothing."""
        self.cadence.saved()
        epoch = self.epoch if epoch is None else epoch
        if step is None:
            step = int(local_value(self.optimizer.iterations))
        if self.split_across_hosts():
            return self.sharded().save(epoch, step=step, extra=extra)
        if self.mpi.rank != 0:
            return None
        return self.store.save(ArrayCheckpoint(self.variables()), epoch, step=step, extra=extra)

    def _start(self, found: Found | None) -> Start:
        """Where a checkpoint (folder, state) resumes, logged; a fresh Start for None."""
        if not found:
            return Start()
        folder, state = found
        start = Start(
            state["epochs_done"], int(state.get("step", 0)), state.get("extra", {}), folder
        )
        _say(f"resumed from {folder} (epoch {start.epoch}, step {start.step})")
        return start

    def after_step(
        self, *, epoch: int | None = None, step: int | None = None, **extra: Any
    ) -> None:
        """Every rank, after every optimizer step: saves when one is due by the clock, and
        when the job is asked to stop saves and exits (SystemExit 143) on every rank."""
        agreed = agree_after_step(self.cadence)
        if not agreed:
            return
        attach_state(self.model)  # inside Keras 3's fit on JAX: every rank, now
        saved = self.save(epoch=epoch, step=step, **extra)
        if agreed & STOP:
            if saved is not None:  # the leader: the launcher puts this in the failure file
                emit(stopped_line(f"checkpoint saved in {saved}; a restarted job resumes from it"))
            raise SystemExit(STOPPED_CODE)

    def callback(self):
        """The Keras callback for `fit` (of the model's own Keras: tf.keras, tf_keras or
        Keras 3): after_step after each batch, save after every `every_epochs` epochs."""
        keras = importlib.import_module(
            next(  # the Keras the model's classes come from
                kind.__module__.partition(".")[0]
                for kind in type(self.model).__mro__
                if kind.__module__.startswith(("keras.", "tf_keras."))
            )
        )
        checkpoints = self
        callback: Any = keras.callbacks.Callback  # of the Keras imported above

        class SaveCheckpoints(callback):
            def on_train_begin(self, logs=None):
                StopRequest.arm()

            def on_epoch_begin(self, epoch, logs=None):
                checkpoints.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                checkpoints.after_step()

            def on_epoch_end(self, epoch, logs=None):
                if checkpoints.every_epochs and (epoch + 1) % checkpoints.every_epochs == 0:
                    checkpoints.save(epoch=epoch + 1)

        return SaveCheckpoints()
