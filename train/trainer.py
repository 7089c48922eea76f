"""The built-in Horovod/Keras trainer: what every rank runs for a job without a user script.

A straight line: data -> model -> compile -> resume -> fit -> verify -> export. Lines that
exist because training is distributed are marked `# distributed:`. Only rank 0 prints, writes
checkpoints and exports; every rank computes.
"""

from __future__ import annotations

import hashlib
import math

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

from container.errors import PlatformError
from container.sagemaker_config import Channel, read_channels
from container.protocol import Mark, mark_line, stopped_line
from train import distributed
from train.accumulation import AccumulatingModel
from train.batching import BatchPlan
from train.callbacks import Checkpointer, EpochReport, StopOnRequest
from train.checkpoints import CheckpointStore
from train.data import DataError, Dataset, read_channel, shard
from train.export import export_model, write_history
from train.hyperparameters import TrainerConfig
from train.models import BUILDERS
from train.rank import RankContext, emit
from train.schedule import WarmupSchedule


def say(message: str) -> None:
    if hvd.rank() == 0:
        emit(f"trainer: {message}")


def mark(moment: Mark) -> None:
    if hvd.rank() == 0:
        emit(mark_line(moment))


def load_share(context: RankContext, channel: Channel) -> Dataset:
    """This rank's share of a channel. # distributed: sharding by rank or by local rank."""
    data = read_channel(context.paths.channel(channel.name))
    share = shard(data, by_host=channel.sharded_by_host, rank=context.rank,
                  world_size=context.world_size, local_rank=context.local_rank,
                  local_size=context.local_size)
    if not len(share):
        raise DataError(
            f"rank {context.rank} on host {context.host} got no samples of channel "
            f"{channel.name} ({len(data)} sample(s) for {context.world_size} rank(s)"
            f"{' on this host' if channel.sharded_by_host else ''}); add data or use fewer "
            f"ranks" + (" or FullyReplicated" if channel.sharded_by_host else ""))
    return share


def class_labels(train: Dataset) -> np.ndarray:
    """Every label seen on any rank, sorted. # distributed: ranks may each miss some."""
    seen = hvd_tf.allgather_object(np.unique(train.y).tolist(), name="labels")
    return np.array(sorted(set().union(*seen)), dtype=np.int64)


def feature_statistics(train: Dataset) -> tuple[int, np.ndarray, np.ndarray]:
    """(samples, mean, variance) per feature over the whole training set.

    # distributed: summed in rank order on every rank, so every rank gets identical numbers.
    """
    x = train.x.astype(np.float64)
    parts = hvd_tf.allgather_object((len(x), x.sum(axis=0), (x * x).sum(axis=0)), name="stats")
    count = sum(p[0] for p in parts)
    mean = sum(p[1] for p in parts) / count
    variance = sum(p[2] for p in parts) / count - mean * mean
    return count, mean.astype(np.float32), np.maximum(variance, 0).astype(np.float32)


def to_indices(data: Dataset, classes: np.ndarray, channel: str) -> np.ndarray:
    index = np.searchsorted(classes, data.y)
    unknown = (index >= len(classes)) | (classes[np.minimum(index, len(classes) - 1)] != data.y)
    if unknown.any():
        raise DataError(f"channel {channel}: label {data.y[unknown][0]} never occurs in the "
                        f"train channel (classes are {classes.tolist()})")
    return index


def training_input(train: Dataset, labels: np.ndarray, plan: BatchPlan, config: TrainerConfig,
                   rank: int) -> tf.data.Dataset:
    """Endless shuffled per-device batches (one optimizer step each, split into micro-batches
    by AccumulatingModel): every rank can run the same number of steps whatever the size of
    its share. # distributed: a per-rank shuffle seed."""
    return (tf.data.Dataset.from_tensor_slices((train.x, labels))
            .shuffle(min(len(labels), config.shuffle_buffer), seed=config.seed + rank,
                     reshuffle_each_iteration=True)
            .repeat()
            .batch(plan.per_device_batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE))


def compile_for_training(model: tf.keras.Model, config: TrainerConfig, plan: BatchPlan,
                         schedule: WarmupSchedule
                         ) -> tuple[tf.keras.Model, tf.keras.optimizers.Optimizer]:
    """(what `fit` runs, its optimizer), compiled. # distributed: both average over ranks.

    One micro-batch per step: Keras' own step with Horovod's DistributedOptimizer, whose
    per-gradient allreduces start while backpropagation is still running (2 ranks: 10% faster
    than one grouped allreduce after it). k micro-batches: AccumulatingModel (one step, one
    grouped allreduce; 1.2x faster than Horovod's backward_passes_per_step, see its module).
    """
    inner = tf.keras.optimizers.SGD(schedule, momentum=config.momentum) \
        if config.optimizer == "sgd" else tf.keras.optimizers.Adam(schedule)
    if plan.accumulation_steps == 1:
        stepper, optimizer = model, distributed.optimizer(
            inner, fp16_allreduce=config.fp16_allreduce)
    else:
        stepper, optimizer = AccumulatingModel(
            model, plan.accumulation_steps, compression=hvd_tf.Compression.fp16
            if config.fp16_allreduce else hvd_tf.Compression.none), inner
    stepper.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                    metrics=["accuracy"])
    return stepper, optimizer


def weights_digest(model: tf.keras.Model) -> str:
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
    return digest.hexdigest()


def verify_identical_weights(model: tf.keras.Model) -> None:
    """# distributed: every rank must end with the same model, or averaging silently broke."""
    digests = hvd_tf.allgather_object(weights_digest(model), name="weights_digest")
    if len(set(digests)) > 1:
        raise RuntimeError(
            "model weights differ between ranks after training, so gradients were not "
            f"averaged (digests {', '.join(d[:12] for d in digests)}); check the "
            "TensorFlow/Horovod versions (Keras 3 breaks Horovod's DistributedOptimizer)")


def train(context: RankContext, config: TrainerConfig, plan: BatchPlan) -> None:
    """Train with the config and batch plan that the launcher validated (train.rank_job)."""
    distributed.init()
    if hvd.size() != plan.world_size:
        raise PlatformError(f"Horovod sees {hvd.size()} ranks but the launcher planned "
                            f"{plan.world_size}")
    tf.keras.utils.set_random_seed(config.seed)  # the same initial weights on every rank
    paths = context.paths
    layout = hvd_tf.allgather_object(f"{context.rank}@{context.host}", name="layout")
    say(f"{hvd.size()} rank(s): {', '.join(layout)}; TensorFlow {tf.__version__}, "
        f"Horovod over {'MPI' if hvd.mpi_enabled() else 'Gloo'}")
    mark(Mark.RANKS_UP)
    say(plan.derivation())

    channels = read_channels(paths.input_data_config, paths.data_dir)
    train_share = load_share(context, channels.get("train", Channel("train")))
    classes = class_labels(train_share)
    if len(classes) < 2:
        raise DataError(f"channel train: every label is {classes.tolist()}; a classifier "
                        f"needs at least two classes")
    shapes = set(hvd_tf.allgather_object(train_share.x.shape[1:], name="shapes"))
    if len(shapes) > 1:
        raise DataError(f"channel train: hosts disagree on the sample shape: {sorted(shapes)}")
    total, mean, variance = feature_statistics(train_share)
    steps_per_epoch = max(1, math.ceil(total / plan.global_batch))
    say(f"{total} training samples, {len(classes)} classes, sample shape "
        f"{train_share.x.shape[1:]}; {steps_per_epoch} optimizer steps per epoch")
    mark(Mark.DATA_READ)

    validation = None
    if "validation" in channels or paths.channel("validation").is_dir():
        full = read_channel(paths.channel("validation"))
        share = full if len(full) < hvd.size() else shard(
            full, by_host=channels.get("validation", Channel("validation")).sharded_by_host,
            rank=context.rank, world_size=context.world_size, local_rank=context.local_rank,
            local_size=context.local_size)
        share = share if len(share) else full
        validation = tf.data.Dataset.from_tensor_slices(
            (share.x, to_indices(share, classes, "validation"))).batch(plan.micro_batch)

    model = BUILDERS[config.model](config, train_share.x.shape[1:], len(classes), mean, variance)
    schedule = WarmupSchedule(plan.base_learning_rate, plan.learning_rate,
                              round(config.warmup_epochs * steps_per_epoch))
    stepper, optimizer = compile_for_training(model, config, plan, schedule)
    optimizer.build(model.trainable_variables)

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    store = CheckpointStore(paths.checkpoint_dir, config.keep_checkpoints)
    initial_epoch, history = 0, {}
    if hvd.rank() == 0:
        store.clean_torn()
        resumed = store.resume(checkpoint, lambda message: emit(f"trainer: {message}"))
        if resumed:
            folder, state = resumed
            initial_epoch = state["epochs_done"]
            history = state.get("history", {})
            emit(f"trainer: resumed from {folder} (epochs done: {initial_epoch})")
    initial_epoch = hvd_tf.broadcast_object(initial_epoch, root_rank=0, name="initial_epoch")
    # distributed: every rank starts from rank 0's weights and optimizer state.
    hvd_tf.broadcast_variables(model.variables + optimizer.variables, root_rank=0)

    def save(epochs_done: int, **state) -> None:
        if hvd.rank() == 0:
            store.save(checkpoint, epochs_done, history=report.history, **state)

    stop = StopOnRequest(accumulation_steps=1)  # every batch is one optimizer step
    report = EpochReport(steps_per_epoch * plan.global_batch,
                         lambda: float(schedule(optimizer.iterations)), history)
    callbacks = [hvd.callbacks.MetricAverageCallback(),  # distributed: average epoch metrics
                 stop, report, Checkpointer(save, config.checkpoint_every_epochs, config.epochs)]
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.TensorBoard(str(paths.tensorboard_dir),
                                                        profile_batch=0, write_graph=False))
    stepper.fit(training_input(train_share, to_indices(train_share, classes, "train"), plan,
                               config, context.rank),
                steps_per_epoch=steps_per_epoch, epochs=config.epochs,
                initial_epoch=initial_epoch, validation_data=validation, callbacks=callbacks,
                verbose=0)
    verify_identical_weights(model)

    if stop.stopped_in_epoch is not None:
        save(stop.stopped_in_epoch, interrupted=True)
        say(stopped_line(f"checkpoint saved in {paths.checkpoint_dir}; a restarted job "
                         f"resumes at epoch {stop.stopped_in_epoch + 1}"))
        return
    if hvd.rank() == 0:
        final = {k: v[-1] for k, v in report.history.items()} if report.history else {}
        exported = export_model(model, paths.model_dir, classes=classes.tolist(), info={
            "feature_count": int(np.prod(train_share.x.shape[1:])), "model": config.model,
            "epochs": config.epochs, "world_size": hvd.size(),
            "global_batch": plan.global_batch, "final_metrics": final,
            "tensorflow": tf.__version__})
        if report.history:
            write_history(report.history, paths.output_data_dir)
        summary = " ".join(f"{k}={v:.4f}" for k, v in final.items()
                           if k in ("loss", "accuracy", "val_loss", "val_accuracy"))
        emit(f"RESULT {summary} model={exported}")
        emit(mark_line(Mark.MODEL_EXPORTED))
