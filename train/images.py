"""Images: decoding JPEG/PNG to the model's size, and image-folder channels.

Every image is decoded with the channel count of the channel's first image (1 for greyscale,
else 3) and resized to image_size x image_size (the first image's size when image_size is 0), so
a folder of mixed sizes trains, and the model's input shape is known before training starts.
An image folder's records are its files: sharding, shuffling and counting need only the list of
names, never the pixels, so the counting pass reads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from train.data import ChannelFiles, DataError
from train.sharding import Share

HINT = "replace or delete the file, or re-encode it as JPEG or PNG"


@dataclass(frozen=True)
class ImageSpec:
    size: int
    channels: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.size, self.size, self.channels)


def probe(data: bytes, where: str, image_size: int) -> ImageSpec:
    """The spec of a channel from its first image; DataError when it does not decode."""
    try:
        image = tf.io.decode_image(data, expand_animations=False)
    except tf.errors.InvalidArgumentError as error:
        raise DataError(
            f"{where}: not a decodable JPEG or PNG image ({error.message}); {HINT}"
        ) from None
    height, width, channels = image.shape
    return ImageSpec(image_size or max(height, width), 1 if channels == 1 else 3)


def decode(data: tf.Tensor, spec: ImageSpec) -> tf.Tensor:
    """Encoded bytes -> float32 (size, size, channels) with pixel values 0..255."""
    image = tf.io.decode_image(data, channels=spec.channels, expand_animations=False)
    image.set_shape([None, None, spec.channels])
    return tf.image.resize(image, [spec.size, spec.size])


def augment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """A random horizontal flip and a random crop of the image padded by 1/8 of its size."""
    size, channels = image.shape[0], image.shape[2]
    pad = max(1, size // 8)
    image = tf.image.stateless_random_flip_left_right(image, seed)
    padded = tf.image.resize_with_crop_or_pad(image, size + 2 * pad, size + 2 * pad)
    return tf.image.stateless_random_crop(padded, [size, size, channels], seed + 1)


class ImageFolder:
    """One rank's share of an image-folder channel; labels are the class folder names."""

    def __init__(self, channel: ChannelFiles, share: Share, image_size: int):
        self.files = share.files[share.offset :: share.step]
        first = channel.files[0]
        self.spec = probe(first.read_bytes(), str(first), image_size)
        self.shape = self.spec.shape
        self.names = [channel.class_name(path) for path in self.files]

    def labels(self) -> tuple[int, set]:
        return len(self.files), set(self.names)

    def samples(self, shuffle_seed: int | tf.Tensor | None) -> tf.data.Dataset:
        paths = tf.data.Dataset.from_tensor_slices(([str(p) for p in self.files], self.names))
        if shuffle_seed is not None:  # names only: the whole list fits whatever the images
            paths = paths.shuffle(len(self.files), seed=shuffle_seed)
        return paths.map(
            lambda path, name: (decode(tf.io.read_file(path), self.spec), name),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=False,
        )

    def diagnose(self) -> None:
        """DataError naming the first image of the share that does not decode."""
        for path in self.files:
            try:
                decode(tf.constant(path.read_bytes()), self.spec)
            except tf.errors.InvalidArgumentError as error:
                raise DataError(
                    f"{path}: not a decodable JPEG or PNG image ({error.message}); {HINT}"
                ) from None
