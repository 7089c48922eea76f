"""Keras callbacks of the trainer, each doing one thing, each marked where it is distributed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from job.protocol import metrics_line
from job.tracking import RunLogger, metric
from train.agreement import SAVE, STOP, Cadence, agree_after_step
from train.framework import keras
from train.jax_state import attach_state
from train.progress import Progress
from train.rank import emit


class StopOnRequest(keras.callbacks.Callback):
    """Stops every rank after the same optimizer step once any rank got the stop signal, and
    saves a checkpoint mid-epoch when `cadence` says one is due (`save`, which every rank
    calls: under MultiWorkerMirroredStrategy every worker takes part).

    # distributed: the ranks agree with one allreduce of a few bits after each optimizer step
    (every `accumulation_steps` micro-batches), so no rank leaves or saves while another waits
    in a collective.
    """

    def __init__(
        self,
        accumulation_steps: int,
        cadence: Cadence | None = None,
        save: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__()
        self.accumulation_steps, self.cadence, self.save = accumulation_steps, cadence, save
        self.stopped = False

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if (batch + 1) % self.accumulation_steps:
            return
        # A plain MPI allreduce of a few bits costs microseconds; Horovod's tensor allreduce
        # would cost a background-thread cycle per step.
        agreed = agree_after_step(self.cadence)
        if agreed & STOP:
            self.model.stop_training = True
            self.stopped = True
        elif agreed & SAVE:
            attach_state(self.model)  # Keras 3 on JAX, mid-epoch: every rank, now
            self.save()


class StepCount(keras.callbacks.Callback):
    """Batches of `fit` this process finished, over every `fit` it is passed to (the built-in
    trainer: one per optimizer step, or k when Keras 3's optimizer accumulates k)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.count += 1


class EpochReport(keras.callbacks.Callback):
    """The `leader` (rank 0) prints one METRICS line per epoch (averaged over ranks:
    train.sync) and logs it to the job's MLflow run when there is one (`run`, the leader's
    only: queued for its own thread, so the other ranks never wait in the next allreduce for
    the server); the epoch a resumed job continues reports the steps it ran after the resume."""

    def __init__(
        self,
        samples_per_step: int,
        learning_rate: Callable[[], float],
        history: dict[str, list[float]],
        leader: bool,
        run: RunLogger | None = None,
    ) -> None:
        super().__init__()
        self.samples_per_step = samples_per_step
        self.learning_rate = learning_rate
        self.leader = leader
        self.run = run
        self.started = self.trained = 0.0
        self.steps = 0
        self.history = history  # resumed jobs continue the curves of earlier runs

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.started = time.perf_counter()
        self.steps = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.trained = time.perf_counter()
        self.steps += 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.model.stop_training:  # an interrupted epoch has no comparable numbers
            return
        elapsed = self.trained - self.started  # training only, not validation
        values = {
            **(logs or {}),
            "lr": self.learning_rate(),
            "samples_per_sec": self.steps * self.samples_per_step / max(elapsed, 1e-9),
        }
        for key, value in values.items():
            self.history.setdefault(key, []).append(float(value))
        if self.leader:
            emit(metrics_line(epoch + 1, values))
        if self.run:
            self.run.log(metrics=[metric(key, value, epoch + 1) for key, value in values.items()])


class Checkpointer(keras.callbacks.Callback):
    """Rank 0 saves a checkpoint every `every` epochs (and the last one)."""

    def __init__(self, save: Callable[[], None], every: int, epochs: int) -> None:
        super().__init__()
        self.save, self.every, self.epochs = save, every, epochs

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        done = epoch + 1
        if self.model.stop_training or not self.every:
            return
        if done % self.every == 0 or done == self.epochs:
            self.save()


class ReportProgress(keras.callbacks.Callback):
    """Tells the launcher's watchdog that this rank finished an optimizer step (every
    `accumulation_steps` batches), a validation batch or an epoch; `first_step` continues the
    count of a resumed job."""

    def __init__(self, accumulation_steps: int = 1, first_step: int = 0) -> None:
        super().__init__()
        self.accumulation_steps, self.batches = accumulation_steps, first_step * accumulation_steps

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.batches += 1
        if self.batches % self.accumulation_steps == 0:
            Progress.report(self.batches // self.accumulation_steps)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        Progress.report(self.batches // self.accumulation_steps)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        Progress.report(self.batches // self.accumulation_steps, force=True)
