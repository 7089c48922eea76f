"""The built-in Keras trainer: what every rank runs for a job without a user script.

A straight line: data -> model -> compile -> resume -> fit -> verify -> export. Lines that
exist because training is distributed are marked `# distributed:`; how the ranks synchronise
(Horovod; on the TensorFlow 2.21 image TensorFlow's MultiWorkerMirroredStrategy, or Keras 3's
keras.distribution on JAX) is train.sync's, and which Keras builds the model is
train.framework's. Only rank 0 prints and keeps checkpoints and the model; every rank computes.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
from mpi4py import MPI

from job.errors import ConfigError, PlatformError
from job.sagemaker_config import Channel, read_channels
from job.protocol import Mark, mark_line, stopped_line
from train.accumulation import AccumulatingModel
from job.batching import BatchPlan
from train.agreement import Cadence
from train.callbacks import Checkpointer, EpochReport, ReportProgress, StepCount, StopOnRequest
from train.checkpoints import CheckpointStore, loaded_values, variables_checkpoint
from train.data import DataError, list_channel
from train.export import export_model, write_history
from train.framework import ON_JAX, keras
from job.rank_job import DATA_SERVICE_ENV
from job.trainer_config import TrainerConfig
from job import notices
from job.tracking import FLUSH_SECONDS, WARNING_FILE, RunLogger
from train.models import (BUILDERS, initial_weights_file, load_initial_weights,
                          use_mixed_precision)
from train.pipeline import (Source, Table, evaluation_input, label_lookup, moments,
                            naming_bad_records, open_source, served, training_input)
from train.position import JobPosition, stream_start
from train.rank import RankContext, StopRequest, emit
from train.schedule import WarmupSchedule
from train.sharding import assign, readers
from train.sync import Sync, local_value, synchronise


def say(message: str) -> None:
    if MPI.COMM_WORLD.Get_rank() == 0:
        emit(f"trainer: {message}")


def mark(moment: Mark) -> None:
    if MPI.COMM_WORLD.Get_rank() == 0:
        emit(mark_line(moment))


def open_share(context: RankContext, config: TrainerConfig, channel: Channel,
               whole: bool = False) -> Source:
    """This rank's files or records of a channel (all of it when `whole`).

    # distributed: split by global rank (FullyReplicated) or by local rank (ShardedByS3Key).
    """
    files = list_channel(channel.name, context.paths.channel(channel.name),
                         channel.content_type)
    reader, count = (0, 1) if whole else readers(
        by_host=channel.sharded_by_host, rank=context.rank, world_size=context.world_size,
        local_rank=context.local_rank, local_size=context.local_size)
    return open_source(files, assign(files.files, reader, count), config)


def count_train(sync: Sync, source: Source, channel: Channel, context: RankContext
                ) -> tuple[int, int, list, tuple[int, ...]]:
    """(samples on all ranks, samples in this rank's share, sorted classes, sample shape),
    from the counting pass.

    # distributed: every rank counts its own share; all ranks get the same totals.
    """
    count, labels = source.labels()
    shares = sync.allgather_object((count, sorted(labels), tuple(source.shape)),
                                   name="train_share")
    empty = [rank for rank, share in enumerate(shares) if not share[0]]
    if empty:
        raise DataError(
            f"rank(s) {', '.join(map(str, empty))} got no samples of channel {channel.name} "
            f"({sum(s[0] for s in shares)} sample(s) for {context.world_size} rank(s)"
            f"{' split per host' if channel.sharded_by_host else ''}); add data or use fewer "
            f"ranks" + (" or FullyReplicated" if channel.sharded_by_host else ""))
    shapes = {share[2] for share in shares}
    if len(shapes) > 1:
        raise DataError(f"channel {channel.name}: hosts disagree on the sample shape: "
                        f"{sorted(shapes)}")
    classes = sorted(set().union(*(share[1] for share in shares)))
    if len(classes) < 2:
        raise DataError(f"channel {channel.name}: every label is {classes}; a classifier "
                        f"needs at least two classes")
    return sum(share[0] for share in shares), count, classes, shapes.pop()


def feature_statistics(sync: Sync, source: Source, seed: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) per feature over a bounded sample of every rank's share.

    # distributed: summed in rank order on every rank, so every rank gets identical numbers.
    """
    parts = sync.allgather_object(moments(source, seed), name="stats")
    count = sum(p[0] for p in parts)
    mean = sum(p[1] for p in parts) / count
    variance = sum(p[2] for p in parts) / count - mean * mean
    return mean.astype(np.float32), np.maximum(variance, 0).astype(np.float32)


def validation_source(context: RankContext, config: TrainerConfig, channel: Channel,
                      classes: list) -> tuple[Source, int]:
    """(this rank's share of the validation channel, or all of it when the share is empty;
    its samples)."""
    source = open_share(context, config, channel)
    count, labels = source.labels()
    if not count:
        source = open_share(context, config, channel, whole=True)
        count, labels = source.labels()
    unknown = sorted(labels - set(classes))
    if unknown:
        raise DataError(f"channel {channel.name}: label {unknown[0]!r} never occurs in the "
                        f"train channel (classes are {classes})")
    return source, count


def compile_for_training(sync: Sync, model: keras.Model, config: TrainerConfig,
                         plan: BatchPlan, schedule: WarmupSchedule
                         ) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """(what `fit` runs, its optimizer), compiled. # distributed: both average over ranks.

    One micro-batch per step: Keras' own step with the synchronising optimizer (train.sync).
    k micro-batches: AccumulatingModel (one step, one mean over ranks; with Horovod 1.2x
    faster than its backward_passes_per_step, see its module), or on Keras 3 its optimizer's
    own accumulation (each micro-batch a batch of `fit`, an update every k).
    """
    steps = plan.accumulation_steps
    accumulate = {"gradient_accumulation_steps": steps} \
        if sync.optimizer_accumulates and steps > 1 else {}
    inner = keras.optimizers.SGD(schedule, momentum=config.momentum, **accumulate) \
        if config.optimizer == "sgd" else keras.optimizers.Adam(schedule, **accumulate)
    if steps == 1 or sync.optimizer_accumulates:
        stepper, optimizer = model, sync.optimizer(inner)
    else:
        stepper, optimizer = AccumulatingModel(
            model, plan.accumulation_steps, sync.gradient_mean()), inner
    stepper.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                    metrics=["accuracy"])
    return stepper, optimizer


def weights_digest(model: keras.Model) -> str:
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(local_value(weight)).tobytes())
    return digest.hexdigest()


def average_batch_statistics(sync: Sync, model: keras.Model) -> None:
    """# distributed: batch normalisation's moving statistics are not trained, each rank keeps
    its own from its own batches; the exported model gets their average over ranks."""
    sync.average_statistics(model.non_trainable_variables)


def verify_identical_weights(sync: Sync, model: keras.Model) -> None:
    """# distributed: every rank must end with the same model, or averaging silently broke."""
    digests = sync.allgather_object(weights_digest(model), name="weights_digest")
    if len(set(digests)) > 1:
        raise RuntimeError(
            "model weights differ between ranks after training, so gradients were not "
            f"averaged (digests {', '.join(d[:12] for d in digests)}); check the "
            "TensorFlow/Horovod versions (Keras 3 breaks Horovod's DistributedOptimizer)")


def train(context: RankContext, config: TrainerConfig, plan: BatchPlan,
          tf_workers: tuple[str, ...] = ()) -> None:
    """Train with the config and batch plan that the launcher validated (job.rank_job): Keras 3
    on JAX for backend=jax, else over MultiWorkerMirroredStrategy when it planned
    `tf_workers`, else Horovod. Rank 0 logs to the job's MLflow run, if any, from a thread of
    its own (job.tracking.RunLogger) and waits for it a bounded time at the end: at most
    FLUSH_SECONDS after training, not at all after a failure."""
    run = RunLogger.of_environment(os.environ, lambda text: notices.warn(
        context.paths, WARNING_FILE, text, "trainer", append=True)) \
        if MPI.COMM_WORLD.Get_rank() == 0 else None
    trained = False
    try:
        _train(context, config, plan, tf_workers, run)
        trained = True
    finally:
        if run:
            run.close(FLUSH_SECONDS if trained else 0)


def _train(context: RankContext, config: TrainerConfig, plan: BatchPlan,
           tf_workers: tuple[str, ...], run: RunLogger | None) -> None:
    sync = synchronise(config.backend, tf_workers, context.local_size, config.fp16_allreduce)
    if sync.size != plan.world_size:
        raise PlatformError(f"{sync.name} sees {sync.size} ranks but the launcher planned "
                            f"{plan.world_size}")
    keras.utils.set_random_seed(config.seed)  # the same initial weights on every rank
    paths = context.paths
    layout = sync.allgather_object(f"{context.rank}@{context.host}", name="layout")
    say(f"{sync.size} rank(s): {', '.join(layout)}; TensorFlow {tf.__version__}, {sync.name}")
    mark(Mark.RANKS_UP)
    say(plan.derivation())

    channels = read_channels(paths.input_data_config, paths.data_dir)
    train_channel = channels.get("train", Channel("train"))
    train_source = open_share(context, config, train_channel)
    total, share, classes, shape = count_train(sync, train_source, train_channel, context)
    with naming_bad_records([train_source]):
        mean, variance = feature_statistics(sync, train_source, config.seed + context.rank)
    steps_per_epoch = max(1, math.ceil(total / plan.global_batch))
    say(f"{total} training samples, {len(classes)} classes, sample shape {shape}; "
        f"{steps_per_epoch} optimizer steps per epoch")
    mark(Mark.DATA_READ)
    lookup = label_lookup(classes)

    validation, validation_steps, sources = None, None, [train_source]
    if "validation" in channels or paths.channel("validation").is_dir():
        source, count = validation_source(context, config, channels.get(
            "validation", Channel("validation")), classes)
        validation, validation_steps = sync.evaluation(
            evaluation_input(source, lookup, plan.micro_batch), count, plan.micro_batch)
        sources.append(source)

    if use_mixed_precision(config.model):
        say("mixed precision: float16 compute, float32 variables")

    def build() -> keras.Model:
        return BUILDERS[config.model](config, shape, len(classes), mean, variance)

    with sync.scope():
        model = build()
        if paths.channel("weights").is_dir():
            load_initial_weights(model, initial_weights_file(paths.channel("weights")))
        schedule = WarmupSchedule(plan.base_learning_rate, plan.learning_rate,
                                  round(config.warmup_epochs * steps_per_epoch))
        stepper, optimizer = compile_for_training(sync, model, config, plan, schedule)
        optimizer.build(model.trainable_variables)

    checkpoint = variables_checkpoint(model, optimizer, arrays=ON_JAX)
    store = CheckpointStore(paths.checkpoint_dir, config.keep_checkpoints)
    start, history = JobPosition(0, 0, 0), {}
    if sync.rank == 0:
        store.clean_torn()
        resumed = store.resume(checkpoint, lambda message: emit(f"trainer: {message}"))
        if resumed:
            folder, state = resumed
            start = JobPosition.from_state(state, plan.global_batch, steps_per_epoch)
            history = state.get("history", {})
            emit(f"trainer: resumed from {folder} at {start.describe()}")
    # Armed before the first collective that precedes training, on every rank: from here a
    # stop waits for the step the ranks agree on. Armed any later, a stop could reach one
    # rank unarmed (it exits at once) while another waits for it in a collective.
    StopRequest.arm()
    start = sync.broadcast_object(start, name="start")
    # distributed: every rank starts from rank 0's weights and optimizer state.
    sync.broadcast_variables(model.variables + optimizer.variables, loaded_values(checkpoint))

    # Batches of `fit` per optimizer step: 1, or k micro-batches when Keras 3's optimizer
    # accumulates them (train.accumulation's step takes all k in one batch).
    batches_per_step = plan.accumulation_steps if sync.optimizer_accumulates else 1
    batches = StepCount()

    def position() -> JobPosition:
        return start.after(batches.count // batches_per_step, plan.global_batch,
                           steps_per_epoch)

    def write(**state) -> None:
        """The checkpoint of where the job stands (batch statistics already averaged)."""
        if sync.rank == 0:
            now = position()
            store.save(checkpoint, now.epochs_done, **now.counts(plan.global_batch),
                       history=report.history, **state)
        elif sync.saves_on_every_rank:  # it must take part; only rank 0's copy is kept
            scratch_write(checkpoint)

    cadence = Cadence(config.checkpoint_every_minutes, leader=sync.rank == 0)

    def save() -> None:
        average_batch_statistics(sync, model)  # so a resumed job goes on as if never stopped
        write()
        cadence.saved()

    # at an optimizer step: a stop, or a checkpoint inside the epoch when one is due
    stop = StopOnRequest(batches_per_step, cadence, save)
    report = EpochReport(plan.global_batch // batches_per_step,
                         lambda: float(schedule(local_value(optimizer.iterations))), history, run)
    callbacks = [*sync.callbacks(),  # distributed: average epoch metrics
                 batches, stop, report,
                 Checkpointer(save, config.checkpoint_every_epochs, config.epochs),
                 ReportProgress(batches_per_step, first_step=start.epochs_done * steps_per_epoch
                                + start.steps_in_epoch)]
    if sync.rank == 0:
        callbacks.append(keras.callbacks.TensorBoard(
            str(paths.tensorboard_dir), profile_batch=config.profiled_steps, write_graph=False))

    service = os.environ.get(DATA_SERVICE_ENV, "")
    if service:  # distributed: a heterogeneous job's data hosts produce the training input
        if isinstance(train_source, Table):
            raise ConfigError(
                "the data hosts serve the input of TFRecord or image channels; this train "
                "channel is CSV or NPZ, which the ranks hold in memory: convert it to "
                "TFRecord, or train without a data group")
        say(f"training input served by the data hosts' tf.data service at {service}")

    def fit(epochs: int, steps_each: int) -> None:
        """Train from where the job stands to the end of epoch `epochs`, `steps_each` steps
        per epoch."""
        now = position()
        say(f"training from {now.describe()} to the end of epoch {epochs}")
        stream = training_input(
            train_source, lookup, plan.per_device_batch // batches_per_step, config,
            config.seed + context.rank, augment=config.augment and len(shape) == 3,
            start=stream_start(now.samples_done, plan.world_size, share))
        stepper.fit(sync.distribute(served(stream, service) if service else stream),
                    steps_per_epoch=steps_each * batches_per_step, epochs=epochs,
                    initial_epoch=now.epochs_done,
                    validation_data=validation, validation_steps=validation_steps,
                    callbacks=callbacks, verbose=0)

    with naming_bad_records(sources):
        if start.steps_in_epoch and start.epochs_done < config.epochs:
            fit(start.epochs_done + 1, steps_per_epoch - start.steps_in_epoch)  # its rest
        if not stop.stopped:
            fit(config.epochs, steps_per_epoch)
    average_batch_statistics(sync, model)
    verify_identical_weights(sync, model)

    if stop.stopped:
        write(interrupted=True)  # the statistics were averaged just above
        say(stopped_line(f"checkpoint saved in {paths.checkpoint_dir}; a restarted job "
                         f"resumes at {position().describe()}"))
        return
    exportable = sync.plain(model, build)
    if sync.rank == 0:
        final = {k: v[-1] for k, v in report.history.items()} if report.history else {}
        exported = export_model(exportable, paths.model_dir, classes=classes, info={
            "feature_count": int(np.prod(shape)), "model": config.model,
            "epochs": config.epochs, "world_size": sync.size,
            "global_batch": plan.global_batch, "final_metrics": final,
            "tensorflow": tf.__version__, **({"keras": keras.__version__} if ON_JAX else {})})
        if report.history:
            write_history(report.history, paths.output_data_dir)
        summary = " ".join(f"{k}={v:.4f}" for k, v in final.items()
                           if k in ("loss", "accuracy", "val_loss", "val_accuracy"))
        emit(f"RESULT {summary} model={exported}")
        if run:
            run.log(tags={"model.location": exported})
        emit(mark_line(Mark.MODEL_EXPORTED))


def scratch_write(checkpoint: tf.train.Checkpoint) -> None:
    """A worker's part in a MultiWorkerMirroredStrategy save, written and thrown away."""
    folder = Path(tempfile.mkdtemp(prefix="checkpoint-"))
    try:
        checkpoint.write(str(folder / "ckpt"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
