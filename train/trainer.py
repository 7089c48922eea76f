"""The built-in Keras trainer: what every rank runs for a job without a user script.

A straight line of named steps over one `Trainer` (who this rank is, what the launcher planned,
the stack it synchronises with): connect -> prepare data -> build and compile -> resume -> fit
(and verify) -> export, or keep the checkpoint of a stopped job. Lines that exist because
training is distributed are marked `# distributed:`; how the ranks synchronise (Horovod; on the
TensorFlow 2.21 image TensorFlow's MultiWorkerMirroredStrategy, or Keras 3's
keras.distribution on JAX) is train.sync's, and which Keras builds the model is
train.framework's. Only the leader (rank 0, `Trainer.leader`) prints and keeps checkpoints and
the model, except that each process writes its own shards of a model split across processes
(train.checkpoints: who writes what); every rank computes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import tensorflow as tf

from job import notices
from job.batching import BatchPlan
from job.errors import ConfigError, PlatformError
from job.protocol import Mark, mark_line, stopped_line
from job.rank_job import DATA_SERVICE_ENV
from job.sagemaker_config import Channel, read_channels
from job.tracking import FLUSH_SECONDS, WARNING_FILE, RunLogger
from job.trainer_config import TrainerConfig
from train import jax_arrays, layouts
from train.agreement import Cadence
from train.callbacks import Checkpointer, EpochReport, ReportProgress, StepCount, StopOnRequest
from train.checkpoints import (
    CheckpointStore,
    LeaderCheckpoints,
    ShardedCheckpoints,
    checkpoints_for,
)
from train.data import DataError, list_channel
from train.export import export_model, write_history
from train.framework import ON_JAX, keras
from train.logs import log
from train.models import BUILDERS, initial_weights_file, load_initial_weights, use_mixed_precision
from train.pipeline import (
    Source,
    Table,
    evaluation_input,
    label_lookup,
    moments,
    naming_bad_records,
    open_source,
    served,
    training_input,
)
from train.position import JobPosition, stream_start
from train.rank import RankContext, StopRequest, emit
from train.schedule import WarmupSchedule
from train.sharding import assign, readers
from train.sync import MODEL_AXIS, Sync, local_value, shard_digests, synchronise


@dataclass(frozen=True)
class Trainer:
    """What every step of one rank's training shares: who the rank is, what the launcher
    planned, the stack the ranks synchronise with, and the leader's MLflow run (`tracking`).
    `leader` is the one answer to "am I rank 0?" (train.rank.world_rank, which the log asks
    too; connect checks that the stack numbers the ranks as the launcher did): the leader alone
    prints, logs and keeps checkpoints and the model."""

    context: RankContext
    config: TrainerConfig
    plan: BatchPlan
    sync: Sync
    tracking: RunLogger | None

    @property
    def leader(self) -> bool:
        return self.context.is_leader

    @property
    def reader(self) -> int:
        """Which share of the input this rank reads (ranks a model is split across read the
        same one: Sync.data_group), and the seed of its shuffling."""
        return self.context.rank // self.sync.data_group

    def say(self, message: str) -> None:
        """A line of the log (train.logs), which the leader alone prints."""
        log.info(f"trainer: {message}")

    def mark(self, moment: Mark) -> None:
        if self.leader:
            emit(mark_line(moment))


def open_share(
    context: RankContext,
    config: TrainerConfig,
    channel: Channel,
    whole: bool = False,
    group: int = 1,
) -> Source:
    """This rank's files or records of a channel (all of it when `whole`).

    # distributed: split by global rank (FullyReplicated) or by local rank (ShardedByS3Key);
    # the `group` ranks a model is split across (Sync.data_group) read the same share.
    """
    if group > 1 and channel.sharded_by_host and not whole:
        raise ConfigError(
            f"channel {channel.name} is ShardedByS3Key, so each host holds different data, "
            f"but model_parallel splits the model across {group} processes on different "
            "hosts, which must read the same data; use FullyReplicated, or a model_parallel "
            "no larger than each host's devices"
        )
    files = list_channel(channel.name, context.paths.channel(channel.name), channel.content_type)
    reader, count = (
        (0, 1)
        if whole
        else readers(
            by_host=channel.sharded_by_host,
            rank=context.rank // group,
            world_size=context.world_size // group,
            local_rank=context.local_rank,
            local_size=context.local_size,
        )
    )
    return open_source(files, assign(files.files, reader, count), config)


def count_train(
    sync: Sync, source: Source, channel: Channel, context: RankContext
) -> tuple[int, int, list[Any], tuple[int, ...]]:
    """(samples on all ranks, samples in this rank's share, sorted classes, sample shape),
    from the counting pass.

    # distributed: every rank counts its own share; all ranks get the same totals (a share
    # that `data_group` ranks read together counts once).
    """
    count, labels = source.labels()
    shares = sync.allgather_object((count, sorted(labels), tuple(source.shape)), name="train_share")
    empty = [rank for rank, share in enumerate(shares) if not share[0]]
    if empty:
        raise DataError(
            f"rank(s) {', '.join(map(str, empty))} got no samples of channel {channel.name} "
            f"({sum(s[0] for s in shares)} sample(s) for {context.world_size} rank(s)"
            f"{' split per host' if channel.sharded_by_host else ''}); add data or use fewer "
            f"ranks" + (" or FullyReplicated" if channel.sharded_by_host else "")
        )
    shapes = {share[2] for share in shares}
    if len(shapes) > 1:
        raise DataError(
            f"channel {channel.name}: hosts disagree on the sample shape: {sorted(shapes)}"
        )
    classes = sorted(set().union(*(share[1] for share in shares)))
    if len(classes) < 2:
        raise DataError(
            f"channel {channel.name}: every label is {classes}; a classifier "
            f"needs at least two classes"
        )
    total = sum(share[0] for share in shares[:: sync.data_group])
    return total, count, classes, shapes.pop()


def feature_statistics(sync: Sync, source: Source, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) per feature over a bounded sample of every rank's share.

    # distributed: summed in rank order on every rank, so every rank gets identical numbers.
    """
    parts = sync.allgather_object(moments(source, seed), name="stats")
    count = sum(p[0] for p in parts)
    mean = sum(p[1] for p in parts) / count
    variance = sum(p[2] for p in parts) / count - mean * mean
    return mean.astype(np.float32), np.maximum(variance, 0).astype(np.float32)


def validation_source(
    context: RankContext, config: TrainerConfig, channel: Channel, classes: list[Any], group: int
) -> tuple[Source, int]:
    """(this rank's share of the validation channel, or all of it when the share is empty;
    its samples)."""
    source = open_share(context, config, channel, group=group)
    count, labels = source.labels()
    if not count:
        source = open_share(context, config, channel, whole=True)
        count, labels = source.labels()
    unknown = sorted(labels - set(classes))
    if unknown:
        raise DataError(
            f"channel {channel.name}: label {unknown[0]!r} never occurs in the "
            f"train channel (classes are {classes})"
        )
    return source, count


def compile_for_training(
    sync: Sync, model: keras.Model, config: TrainerConfig, plan: BatchPlan, schedule: WarmupSchedule
) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """(what `fit` runs, its optimizer), compiled. # distributed: both average over ranks.

    How a step of `plan.accumulation_steps` micro-batches runs is the stack's (Sync.step):
    one micro-batch is Keras' own step with the synchronising optimizer; k are
    AccumulatingModel's one step (one mean over ranks; with Horovod 1.2x faster than its
    backward_passes_per_step, see train.accumulation), or on Keras 3 its optimizer's own
    accumulation (each micro-batch a batch of `fit`, an update every k).
    """
    optimizer = (
        partial(keras.optimizers.SGD, schedule, momentum=config.momentum)
        if config.optimizer == "sgd"
        else partial(keras.optimizers.Adam, schedule)
    )
    stepper, compiled = sync.step(model, optimizer, plan.accumulation_steps)
    stepper.compile(
        optimizer=compiled, loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return stepper, compiled


def average_batch_statistics(sync: Sync, model: keras.Model) -> None:
    """# distributed: batch normalisation's moving statistics are not trained, each rank keeps
    its own from its own batches; the exported model gets their average over ranks."""
    sync.average_statistics(model.non_trainable_variables)


def verify_identical_weights(sync: Sync, model: keras.Model) -> None:
    """# distributed: every rank must end with the same model, or averaging silently broke:
    each piece of a weight (the whole weight, unless a model axis splits it) equal on every
    rank that holds it."""
    by_rank = sync.allgather_object(shard_digests(model.weights), name="weights_digest")
    differing = jax_arrays.differing_pieces(by_rank)
    if differing:
        place, digests = next(iter(differing.items()))
        raise RuntimeError(
            "model weights differ between ranks after training, so gradients were not "
            f"averaged ({len(differing)} piece(s) differ; weight {place[0]}'s digests "
            f"{', '.join(d[:12] for d in digests)}); check the TensorFlow/Horovod versions "
            "(Keras 3 breaks Horovod's DistributedOptimizer)"
        )


def train(
    context: RankContext, config: TrainerConfig, plan: BatchPlan, tf_workers: tuple[str, ...] = ()
) -> None:
    """Train with the config and batch plan that the launcher validated (job.rank_job): Keras 3
    on JAX for backend=jax, else over MultiWorkerMirroredStrategy when it planned
    `tf_workers`, else Horovod. The leader logs to the job's MLflow run, if any, from a thread
    of its own (job.tracking.RunLogger) and waits for it a bounded time at the end: at most
    FLUSH_SECONDS after training, not at all after a failure."""
    tracking = (
        RunLogger.of_environment(
            os.environ,
            lambda text: notices.warn(context.paths, WARNING_FILE, text, "trainer", append=True),
        )
        if context.is_leader
        else None
    )
    trained = False
    try:
        trainer = connect(context, config, plan, tf_workers, tracking)
        data = prepare_data(trainer)
        built = build_and_compile(trainer, data)
        start, history = resume(trainer, data, built)
        stopped, standing = fit(trainer, data, built, start, history)
        if stopped:
            keep_stopped(trainer, standing)
        else:
            export(trainer, data, built, history)
        trained = True
    finally:
        if tracking:
            tracking.close(FLUSH_SECONDS if trained else 0)


def connect(
    context: RankContext,
    config: TrainerConfig,
    plan: BatchPlan,
    tf_workers: tuple[str, ...],
    tracking: RunLogger | None,
) -> Trainer:
    """The ranks joined in the stack the launcher planned, numbered as it numbered them."""
    sync = synchronise(
        config.backend,
        tf_workers,
        context.local_size,
        config.fp16_allreduce,
        config.model_parallel,
        getattr(BUILDERS[config.model], "get_layout_map", None),  # a model's own layout
    )
    if sync.size != context.world_size:
        raise PlatformError(
            f"{sync.name} sees {sync.size} ranks but the launcher started {context.world_size}"
        )
    if sync.rank != context.rank:
        raise PlatformError(
            f"{sync.name} numbers this process rank {sync.rank} but the "
            f"launcher started it as rank {context.rank}"
        )
    keras.utils.set_random_seed(config.seed)  # the same initial weights on every rank
    trainer = Trainer(context, config, plan, sync, tracking)
    layout = sync.allgather_object(f"{context.rank}@{context.host}", name="layout")
    trainer.say(
        f"{sync.size} rank(s): {', '.join(layout)}; TensorFlow {tf.__version__}, {sync.name}"
    )
    trainer.mark(Mark.RANKS_UP)
    trainer.say(plan.derivation())
    return trainer


@dataclass(frozen=True)
class Data:
    """This rank's training and validation input, and what the counting pass found."""

    train: Source  # this rank's share of the train channel
    share: int  # samples in it
    classes: list[Any]  # the labels, sorted: class i is the model's output column i
    shape: tuple[int, ...]  # of one sample
    mean: np.ndarray  # per feature, over every rank's share
    variance: np.ndarray
    steps_per_epoch: int  # optimizer steps
    lookup: tf.lookup.StaticHashTable  # raw label -> class index
    validation: Any  # as `fit` takes it (train.sync), or None without a validation channel
    validation_steps: int | None
    sources: list[Source]  # every source `fit` reads, so a bad record is named


def prepare_data(trainer: Trainer) -> Data:
    """Counts and feature statistics of every rank's share; this rank's validation input."""
    context, config, plan, sync = trainer.context, trainer.config, trainer.plan, trainer.sync
    paths = context.paths
    channels = read_channels(paths.input_data_config, paths.data_dir)
    train_channel = channels.get("train", Channel("train"))
    train_source = open_share(context, config, train_channel, group=sync.data_group)
    total, share, classes, shape = count_train(sync, train_source, train_channel, context)
    with naming_bad_records([train_source]):
        mean, variance = feature_statistics(sync, train_source, config.seed + trainer.reader)
    steps_per_epoch = max(1, math.ceil(total / plan.global_batch))
    trainer.say(
        f"{total} training samples, {len(classes)} classes, sample shape {shape}; "
        f"{steps_per_epoch} optimizer steps per epoch"
    )
    trainer.mark(Mark.DATA_READ)
    lookup = label_lookup(classes)

    validation, validation_steps, sources = None, None, [train_source]
    if "validation" in channels or paths.channel("validation").is_dir():
        source, count = validation_source(
            context,
            config,
            channels.get("validation", Channel("validation")),
            classes,
            sync.data_group,
        )
        validation, validation_steps = sync.evaluation(
            evaluation_input(source, lookup, plan.micro_batch), count, plan.micro_batch
        )
        sources.append(source)
    return Data(
        train_source,
        share,
        classes,
        shape,
        mean,
        variance,
        steps_per_epoch,
        lookup,
        validation,
        validation_steps,
        sources,
    )


@dataclass(frozen=True)
class Built:
    """The model, what trains it, and what its checkpoints hold."""

    model: keras.Model  # what is checkpointed and exported
    stepper: keras.Model  # what `fit` runs (the model, or train.accumulation's step around it)
    optimizer: keras.optimizers.Optimizer
    schedule: WarmupSchedule
    rebuild: Callable[[], keras.Model]  # a new, untrained model of the same kind
    # the leader's whole checkpoint, or every process's shards of a model split across them
    checkpoints: LeaderCheckpoints | ShardedCheckpoints

    def learning_rate(self) -> float:
        """This step's, read from this process's copy of the step count (no collective)."""
        return float(self.schedule(local_value(self.optimizer.iterations)))


def build_and_compile(trainer: Trainer, data: Data) -> Built:
    """The model (from the weights channel's initial weights, if any) and its optimizer, built
    and compiled in the stack's scope, with the learning rate's warm-up schedule."""
    config, plan, paths = trainer.config, trainer.plan, trainer.context.paths
    if use_mixed_precision(config.model):
        trainer.say("mixed precision: float16 compute, float32 variables")
    rebuild = partial(
        BUILDERS[config.model], config, data.shape, len(data.classes), data.mean, data.variance
    )
    with trainer.sync.scope():
        model = rebuild()
        if paths.channel("weights").is_dir():
            load_initial_weights(model, initial_weights_file(paths.channel("weights")))
        schedule = WarmupSchedule(
            plan.base_learning_rate,
            plan.learning_rate,
            round(config.warmup_epochs * data.steps_per_epoch),
        )
        stepper, optimizer = compile_for_training(trainer.sync, model, config, plan, schedule)
        optimizer.build(model.trainable_variables)
    say_layout(trainer, model)
    checkpoints = checkpoints_for(
        model,
        optimizer,
        CheckpointStore(paths.checkpoint_dir, config.keep_checkpoints),
        trainer.sync,
        arrays=ON_JAX,
    )
    if isinstance(checkpoints, ShardedCheckpoints):
        trainer.say(
            "the model is split across processes: each process writes its own shards of each "
            f"checkpoint into its host's {paths.checkpoint_dir} (docs/sharded-checkpoints.md)"
        )
    return Built(model, stepper, optimizer, schedule, rebuild, checkpoints)


def say_layout(trainer: Trainer, model: keras.Model) -> None:
    """On Keras 3 / JAX: what the model weighs whole and on each device, and with a model axis
    how many weights it split (its kernels must be: a layout that split none is warned of, as
    in script mode, train.layouts.check)."""
    if not ON_JAX:
        return
    distribution = keras.distribution.distribution()
    mesh = getattr(distribution, "device_mesh", None)
    shape = dict(zip(mesh.axis_names, mesh.shape)) if mesh is not None else {}
    specs = {
        weight.path: tuple(getattr(weight.value.sharding, "spec", ())) for weight in model.weights
    }
    trainer.say(
        layouts.footprint(
            (
                (weight.shape, np.dtype(weight.dtype).itemsize, specs[weight.path])
                for weight in model.weights
            ),
            shape,
            MODEL_AXIS,
        )
    )
    if trainer.config.model_parallel == 1:
        return
    split = [path for path, spec in specs.items() if layouts.sharded_over(spec, shape) > 1]
    trainer.say(
        f"model axis of {trainer.config.model_parallel}: {len(split)} of {len(specs)} weights "
        f"split" + (f" ({split[0]!r} {specs[split[0]]})" if split else "")
    )
    for text in layouts.check(model, distribution, set(), [w.path for w in model.variables]):
        trainer.say(f"WARNING: {text}")


def resume(
    trainer: Trainer, data: Data, built: Built
) -> tuple[JobPosition, dict[str, list[float]]]:
    """(where the job starts, the metric curves of its earlier runs) from the newest
    checkpoint that reads back, whose weights and optimizer state every rank starts from
    (distributed: the leader's, or each process's own shards of a model split across them)."""
    # Armed before the first collective that precedes training, on every rank: from here a
    # stop waits for the step the ranks agree on. Armed any later, a stop could reach one
    # rank unarmed (it exits at once) while another waits for it in a collective.
    StopRequest.arm()
    resumed = built.checkpoints.resume(trainer.say)
    if not resumed:
        return JobPosition(0, 0, 0), {}
    folder, state = resumed
    start = JobPosition.from_state(state, trainer.plan.global_batch, data.steps_per_epoch)
    trainer.say(f"resumed from {folder} at {start.describe()}")
    return start, state.get("history", {}) if trainer.leader else {}


@dataclass(frozen=True)
class Standing:
    """Where the job stands while it fits (`start` plus the batches of `fit` counted since),
    and its checkpoints of that: every rank saves together, the leader keeps the checkpoint."""

    trainer: Trainer
    built: Built
    start: JobPosition
    history: dict[str, list[float]]  # the curves so far, EpochReport's own
    batches: StepCount
    batches_per_step: int  # batches of `fit` per optimizer step (Sync.batches_per_step)
    steps_per_epoch: int
    cadence: Cadence

    def position(self) -> JobPosition:
        return self.start.after(
            self.batches.count // self.batches_per_step,
            self.trainer.plan.global_batch,
            self.steps_per_epoch,
        )

    def write(self, **state: Any) -> None:
        """The checkpoint of where the job stands (batch statistics already averaged); every
        rank calls it (train.checkpoints: who writes what)."""
        now = self.position()
        self.built.checkpoints.save(
            now.epochs_done,
            **now.counts(self.trainer.plan.global_batch),
            history=self.history,
            **state,
        )

    def save(self) -> None:
        """A checkpoint every rank joins, at an epoch's end or an optimizer step, with the
        batch statistics averaged first: a resumed job goes on as if never stopped."""
        average_batch_statistics(self.trainer.sync, self.built.model)
        self.write()
        self.cadence.saved()


def fit(
    trainer: Trainer, data: Data, built: Built, start: JobPosition, history: dict[str, list[float]]
) -> tuple[bool, Standing]:
    """(whether a stop request ended training early, where the job stands): train from
    `start` to the end of the last epoch, saving checkpoints on the way; then check that every
    rank holds the same model."""
    config, plan, sync = trainer.config, trainer.plan, trainer.sync
    batches_per_step = sync.batches_per_step(plan.accumulation_steps)
    standing = Standing(
        trainer,
        built,
        start,
        history,
        StepCount(),
        batches_per_step,
        data.steps_per_epoch,
        Cadence(config.checkpoint_every_minutes, leader=trainer.leader),
    )
    # at an optimizer step: a stop, or a checkpoint inside the epoch when one is due
    stop = StopOnRequest(batches_per_step, standing.cadence, standing.save)
    report = EpochReport(
        plan.global_batch // batches_per_step,
        built.learning_rate,
        history,
        trainer.leader,
        trainer.tracking,
    )
    callbacks = [
        *sync.callbacks(),  # distributed: average epoch metrics
        standing.batches,
        stop,
        report,
        Checkpointer(standing.save, config.checkpoint_every_epochs, config.epochs),
        ReportProgress(
            batches_per_step,
            first_step=start.epochs_done * data.steps_per_epoch + start.steps_in_epoch,
        ),
    ]
    if trainer.leader:
        callbacks.append(
            keras.callbacks.TensorBoard(
                str(trainer.context.paths.tensorboard_dir),
                profile_batch=config.profiled_steps,
                write_graph=False,
            )
        )

    service = os.environ.get(DATA_SERVICE_ENV, "")
    if service:  # distributed: a heterogeneous job's data hosts produce the training input
        if isinstance(data.train, Table):
            raise ConfigError(
                "the data hosts serve the input of TFRecord or image channels; this train "
                "channel is CSV or NPZ, which the ranks hold in memory: convert it to "
                "TFRecord, or train without a data group"
            )
        trainer.say(f"training input served by the data hosts' tf.data service at {service}")

    with naming_bad_records(data.sources):
        if start.steps_in_epoch and start.epochs_done < config.epochs:
            fit_epochs(
                trainer,
                data,
                built,
                standing,
                callbacks,
                service,  # its rest
                start.epochs_done + 1,
                data.steps_per_epoch - start.steps_in_epoch,
            )
        if not stop.stopped:
            fit_epochs(
                trainer,
                data,
                built,
                standing,
                callbacks,
                service,
                config.epochs,
                data.steps_per_epoch,
            )
    average_batch_statistics(sync, built.model)
    verify_identical_weights(sync, built.model)
    return stop.stopped, standing


def fit_epochs(
    trainer: Trainer,
    data: Data,
    built: Built,
    standing: Standing,
    callbacks: list[keras.callbacks.Callback],
    service: str,
    epochs: int,
    steps_each: int,
) -> None:
    """Train from where the job stands to the end of epoch `epochs`, `steps_each` steps per
    epoch, on this rank's share of the input (from the data hosts' `service`, if any)."""
    config, plan = trainer.config, trainer.plan
    now = standing.position()
    trainer.say(f"training from {now.describe()} to the end of epoch {epochs}")
    stream = training_input(
        data.train,
        data.lookup,
        plan.per_device_batch // standing.batches_per_step,
        config,
        config.seed + trainer.reader,
        augment=config.augment and len(data.shape) == 3,
        start=stream_start(now.samples_done, plan.world_size, data.share),  # per reader
    )
    built.stepper.fit(
        trainer.sync.distribute(served(stream, service) if service else stream),
        steps_per_epoch=steps_each * standing.batches_per_step,
        epochs=epochs,
        initial_epoch=now.epochs_done,
        validation_data=data.validation,
        validation_steps=data.validation_steps,
        callbacks=callbacks,
        verbose=0,
    )


def keep_stopped(trainer: Trainer, standing: Standing) -> None:
    """A stopped job's checkpoint, for the restarted job to resume at the step it stopped."""
    standing.write(interrupted=True)  # fit averaged the statistics
    if trainer.leader:  # the launcher's failure report reads it (job.protocol), not the log
        emit(
            "trainer: "
            + stopped_line(
                f"checkpoint saved in {trainer.context.paths.checkpoint_dir}; a "
                f"restarted job resumes at {standing.position().describe()}"
            )
        )


def export(trainer: Trainer, data: Data, built: Built, history: dict[str, list[float]]) -> None:
    """The leader writes the model for serving, the curves and the RESULT line (every rank
    takes part in getting the model out of the stack)."""
    config, plan, sync = trainer.config, trainer.plan, trainer.sync
    exportable = sync.plain(built.model, built.rebuild)
    if not trainer.leader:
        return
    paths = trainer.context.paths
    final = {k: v[-1] for k, v in history.items()} if history else {}
    exported = export_model(
        exportable,
        paths.model_dir,
        classes=data.classes,
        info={
            "feature_count": int(np.prod(data.shape)),
            "model": config.model,
            "epochs": config.epochs,
            "world_size": sync.size,
            "global_batch": plan.global_batch,
            "final_metrics": final,
            "tensorflow": tf.__version__,
            **({"keras": keras.__version__} if ON_JAX else {}),
        },
    )
    if history:
        write_history(history, paths.output_data_dir)
    summary = " ".join(
        f"{k}={v:.4f}"
        for k, v in final.items()
        if k in ("loss", "accuracy", "val_loss", "val_accuracy")
    )
    log.info(f"RESULT {summary} model={exported}")
    if trainer.tracking:
        trainer.tracking.log(tags={"model.location": exported})
    trainer.mark(Mark.MODEL_EXPORTED)
