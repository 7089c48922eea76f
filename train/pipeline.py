"""The tf.data input pipeline of one rank: read its share of a channel, count it, sample its
statistics, and feed training and validation.

Every kind of channel becomes a source with the same four parts:
- `shape`: one sample's shape, known before any data flows (from the channel's first record);
- `labels()`: (samples, set of raw labels) of the share, in one streamed pass that holds no
  data (the counting pass; an image folder needs only its file names); it also finds corrupt
  records before training starts;
- `samples(seed)`: (features float32, raw label) pairs, files in a shuffled order when a seed
  is given, read and decoded in parallel;
- `diagnose()`: called when TensorFlow stops on a record it cannot decode, raises the
  DataError that names the file (and record) and what to do.
Training adds a bounded shuffle buffer, endless repetition (every rank runs the same number of
steps, whatever its share), optional augmentation, batching and autotuned prefetch. Memory is
the shuffle buffer and the prefetched batches, not the channel.

A rank's training stream is a pure function of its seed and a position: pass p over the share
is drawn in an order seeded by (seed, p), and the augmentation of its i-th sample by
(seed, p, i). So a resumed job rebuilds the stream exactly where the stopped one was
(train.position): earlier passes cost nothing, the samples already trained in the current pass
are read and dropped, not trained.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np
import tensorflow as tf

from job.trainer_config import TrainerConfig
from train import images
from train.data import CSV, IMAGE, NPZ, TFRECORD, ChannelFiles, DataError, csv_chunks, npz_chunks
from train.records import TFRecordShards
from train.sharding import Share

STATS_SAMPLE = 4096  # samples per rank behind the normalisation statistics


class Source(Protocol):
    @property  # read-only, so a source's more exact shape (an image's 3-tuple) conforms
    def shape(self) -> tuple[int, ...]: ...

    def labels(self) -> tuple[int, set]: ...

    def samples(self, shuffle_seed: int | tf.Tensor | None) -> tf.data.Dataset: ...

    def diagnose(self) -> None: ...


class Table:
    """One rank's share of a CSV or NPZ channel, streamed in chunks by a Python generator."""

    def __init__(self, channel: ChannelFiles, share: Share):
        self.share = share
        self.reader = csv_chunks if channel.kind == CSV else npz_chunks
        x, _ = next(self.reader(channel.files[0]))
        self.shape = x.shape[1:]

    def chunks(
        self, order: np.random.Generator | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The share's chunks; its files in a random order from `order` (own files only: a
        record split needs every reader to walk the files in the same order)."""
        files: Sequence[Path] = self.share.files
        if order is not None and self.share.by_file:
            files = [files[i] for i in order.permutation(len(files))]
        start = 0
        for path in files:
            for x, y in self.reader(path):
                if x.shape[1:] != self.shape:
                    raise DataError(
                        f"{path}: samples have shape {x.shape[1:]} but the "
                        f"channel's first file has {self.shape}; all files of a "
                        f"channel must match"
                    )
                keep = (np.arange(start, start + len(y)) % self.share.step) == self.share.offset
                start += len(y)
                if keep.any():
                    yield x[keep], y[keep]

    def labels(self) -> tuple[int, set]:
        count, seen = 0, set()
        for _, y in self.chunks():
            count += len(y)
            seen.update(np.unique(y).tolist())
        return count, seen

    def samples(self, shuffle_seed: int | tf.Tensor | None) -> tf.data.Dataset:
        def generate(seed):  # the seed arrives as a NumPy integer, -1 for no shuffling
            return self.chunks(None if seed < 0 else np.random.default_rng(seed))

        return tf.data.Dataset.from_generator(
            generate,
            args=(-1 if shuffle_seed is None else shuffle_seed,),
            output_signature=(
                tf.TensorSpec((None, *self.shape), tf.float32),
                tf.TensorSpec((None,), tf.int64),
            ),
        ).unbatch()

    def diagnose(self) -> None:
        self.labels()  # the readers raise DataError with the file and line


def open_source(channel: ChannelFiles, share: Share, config: TrainerConfig) -> Source:
    if channel.kind in (CSV, NPZ):
        return Table(channel, share)
    if channel.kind == TFRECORD:
        return TFRecordShards(
            channel, share, config.feature_key, config.label_key, config.image_size
        )
    if channel.kind == IMAGE:
        return images.ImageFolder(channel, share, config.image_size)
    raise AssertionError(channel.kind)


@contextmanager
def naming_bad_records(sources: list[Source]) -> Iterator[None]:
    """A record TensorFlow cannot decode while this runs ends in the DataError naming it."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError):
        for source in sources:
            source.diagnose()
        raise


def moments(source: Source, seed: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, sum, sum of squares) per feature of up to STATS_SAMPLE samples of the share."""
    total = np.zeros(source.shape)
    squares = np.zeros(source.shape)
    count = 0
    for x, _ in source.samples(seed).take(STATS_SAMPLE).batch(256):
        x = x.numpy().astype(np.float64)
        count += len(x)
        total += x.sum(axis=0)
        squares += (x * x).sum(axis=0)
    return count, total, squares


def label_lookup(classes: list) -> tf.lookup.StaticHashTable:
    """Raw label -> class index (the model's output column)."""
    keys = tf.constant(classes, tf.string if isinstance(classes[0], str) else tf.int64)
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, tf.range(len(classes), dtype=tf.int64)), -1
    )


PASS_SEEDS = 2**24  # passes of one rank with distinct seeds before they repeat


def training_input(
    source: Source,
    lookup: tf.lookup.StaticHashTable,
    batch: int,
    config: TrainerConfig,
    seed: int,
    augment: bool,
    start: tuple[int, int] = (0, 0),
) -> tf.data.Dataset:
    """Endless shuffled batches of (features, class index); `seed` differs per rank, `start`
    is (pass, samples into it) of the stream (train.position.stream_start). Labels are looked
    up a batch at a time (per sample costs 2x the throughput of tabular data)."""
    first_pass, skip = start

    # Plain Python that builds datasets: AutoGraph's rewrite of it (and of the sources' own
    # generators, which it converts recursively) has nothing to add.
    @tf.autograph.experimental.do_not_convert
    def one_pass(index: tf.Tensor) -> tf.data.Dataset:
        # The pass's order depends on its seeds alone, not on the process's global seed: under a
        # global seed of 0 (hyperparameter seed=0) TensorFlow compares a tensor op seed to 0 in
        # Python and raises OperatorNotAllowedInGraphError. Only this function's graph is reset.
        tf.random.set_seed(None)
        pass_seed = seed * PASS_SEEDS + index % PASS_SEEDS
        samples = source.samples(pass_seed).shuffle(config.shuffle_buffer, seed=pass_seed)
        if augment:  # each sample's own seed pair, so a resumed pass augments the same way
            samples = samples.enumerate().map(lambda i, pair: (pair, tf.stack([pass_seed, i])))
        return samples

    dataset = tf.data.Dataset.range(first_pass, 2**62).flat_map(one_pass).skip(skip)
    if augment:
        dataset = dataset.map(
            lambda pair, pair_seed: (images.augment(pair[0], pair_seed), pair[1]),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    return (
        dataset.batch(batch, drop_remainder=True)
        .map(lambda x, label: (x, lookup.lookup(label)))
        .prefetch(tf.data.AUTOTUNE)
    )


def served(dataset: tf.data.Dataset, service: str) -> tf.data.Dataset:
    """`dataset`, produced by the tf.data service at `service` (a heterogeneous job's data
    hosts: train.data_service) and read from it: its passes dealt to the service's workers as
    they ask (dynamic sharding), so each pass is produced once, whatever the workers' count."""
    distribute = tf.data.experimental.service.distribute
    return dataset.apply(
        distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=service
        )
    )


def evaluation_input(
    source: Source, lookup: tf.lookup.StaticHashTable, batch: int
) -> tf.data.Dataset:
    return (
        source.samples(None)
        .batch(batch)
        .map(lambda x, label: (x, lookup.lookup(label)))
        .prefetch(tf.data.AUTOTUNE)
    )
