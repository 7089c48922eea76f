"""TFRecord channels: shards of tf.train.Example, plain or GZIP.

Each Example holds the features under `feature_key` (a float list, an int64 list, or the
encoded JPEG/PNG bytes of an image) and the integer class under `label_key`. The layout is
read from the channel's first record, so the parser is fixed before any data flows, and a
missing key is reported with the keys the record does have.

Counting a share parses the labels only. A record that TensorFlow cannot read (a bad CRC, a
truncated file) or parse stops the pipeline with an error that names neither file nor record;
`diagnose` then walks the share record by record to name both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from train import images
from train.data import ChannelFiles, DataError
from train.sharding import Share

GZIP_MAGIC = b"\x1f\x8b"
SCAN_BATCH = 4096
HINT = "rewrite the shard, or remove it from the channel"


def compression(path: Path) -> str:
    with open(path, "rb") as file:
        return "GZIP" if file.read(2) == GZIP_MAGIC else ""


@dataclass(frozen=True)
class Layout:
    feature_key: str
    label_key: str
    length: int  # values of a numeric feature; 0 for an encoded image
    image: images.ImageSpec | None
    integer: bool = False  # an int64 list, converted to float32

    @property
    def shape(self) -> tuple[int, ...]:
        return self.image.shape if self.image else (self.length,)

    def parse(self, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        feature = (
            tf.io.FixedLenFeature([], tf.string)
            if self.image
            else tf.io.FixedLenFeature([self.length], tf.int64 if self.integer else tf.float32)
        )
        parsed = tf.io.parse_single_example(
            record, {self.feature_key: feature, self.label_key: tf.io.FixedLenFeature([], tf.int64)}
        )
        value = parsed[self.feature_key]
        return (
            images.decode(value, self.image) if self.image else tf.cast(value, tf.float32),
            parsed[self.label_key],
        )

    def parse_labels(self, records: tf.Tensor) -> tf.Tensor:
        return tf.io.parse_example(records, {self.label_key: tf.io.FixedLenFeature([], tf.int64)})[
            self.label_key
        ]


def inspect(path: Path, feature_key: str, label_key: str, image_size: int) -> Layout:
    """The layout of a channel from the first record of its first file."""
    where = f"{path} record 1"
    try:
        record = next(iter(tf.data.TFRecordDataset(str(path), compression(path))), None)
    except tf.errors.OpError as error:
        raise DataError(f"{where}: not a readable TFRecord ({error.message}); {HINT}") from None
    if record is None:
        raise DataError(f"{path}: the TFRecord file holds no records")
    try:
        features = tf.train.Example.FromString(record.numpy()).features.feature
    except Exception as error:  # protobuf's DecodeError; the module varies by backend
        raise DataError(f"{where}: not a tf.train.Example ({error}); {HINT}") from None
    have = ", ".join(sorted(features)) or "none"
    for key, role in ((feature_key, "feature_key"), (label_key, "label_key")):
        if key not in features:
            raise DataError(
                f"{where}: no feature {key!r} (the record has: {have}); set the "
                f"{role} hyperparameter to the key that holds the "
                f"{'label' if role == 'label_key' else 'features'}"
            )
    if features[label_key].WhichOneof("kind") != "int64_list":
        raise DataError(
            f"{where}: the label {label_key!r} must be an int64 list holding the "
            f"class number, not a {features[label_key].WhichOneof('kind')}"
        )
    feature = features[feature_key]
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list":
        return Layout(
            feature_key, label_key, 0, images.probe(feature.bytes_list.value[0], where, image_size)
        )
    values = feature.float_list.value if kind == "float_list" else feature.int64_list.value
    if not values:
        raise DataError(f"{where}: the feature {feature_key!r} is empty")
    return Layout(feature_key, label_key, len(values), None, kind == "int64_list")


class TFRecordShards:
    """One rank's share of a TFRecord channel."""

    def __init__(
        self, channel: ChannelFiles, share: Share, feature_key: str, label_key: str, image_size: int
    ):
        self.share = share
        self.layout = inspect(channel.files[0], feature_key, label_key, image_size)
        self.shape = self.layout.shape

    def records(self, shuffle_seed: int | tf.Tensor | None) -> tf.data.Dataset:
        files = [str(p) for p in self.share.files]
        kinds = [compression(p) for p in self.share.files]
        if not self.share.by_file:  # every rank reads the same order and keeps its records
            return (
                tf.data.Dataset.from_tensor_slices((files, kinds))
                .flat_map(tf.data.TFRecordDataset)
                .shard(self.share.step, self.share.offset)
            )
        names = tf.data.Dataset.from_tensor_slices((files, kinds))
        if shuffle_seed is not None:
            names = names.shuffle(len(files), seed=shuffle_seed)
        return names.interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(len(files), 8),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=shuffle_seed is None,
        )

    def samples(self, shuffle_seed: int | tf.Tensor | None) -> tf.data.Dataset:
        return self.records(shuffle_seed).map(
            self.layout.parse,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=shuffle_seed is None,
        )

    def labels(self) -> tuple[int, set]:
        count, seen = 0, set()
        try:
            for batch in self.records(None).batch(SCAN_BATCH).map(self.layout.parse_labels):
                count += len(batch)
                seen.update(batch.numpy().tolist())
        except tf.errors.OpError as error:
            self.diagnose()  # names the file and record; this when it finds nothing
            raise DataError(
                f"{len(self.share.files)} TFRecord file(s) from "
                f"{self.share.files[0]}: {error.message}; {HINT}"
            ) from None
        return count, seen

    def diagnose(self) -> None:
        """DataError naming the first file and record (from 1) that cannot be read or parsed."""
        for path in self.share.files:
            iterator = iter(tf.data.TFRecordDataset(str(path), compression(path)))
            index = 0
            while True:
                index += 1
                try:
                    record = next(iterator)
                except StopIteration:
                    break
                except tf.errors.OpError as error:
                    raise DataError(
                        f"{path} record {index}: corrupt ({error.message}); {HINT}"
                    ) from None
                try:
                    self.layout.parse(record)
                except tf.errors.OpError as error:
                    raise DataError(
                        f"{path} record {index}: cannot be parsed with "
                        f"feature_key={self.layout.feature_key!r} ("
                        f"{self.layout.length or 'an encoded image'}) and "
                        f"label_key={self.layout.label_key!r}: {error.message}; "
                        f"{HINT}"
                    ) from None
