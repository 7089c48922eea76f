"""scikit-learn's bundled digits as channel files of every kind, without network.

    python scripts/digits_files.py OUT --kind csv|tfrecord|images [--size 32] [--shards 4]
                                   [--copies 1] [--gzip]

writes OUT/train and OUT/validation (a fixed 80/20 split of the 1797 8x8 images):
- csv: digits.csv, the label then the 64 pixel values (0..16), no header;
- tfrecord: `--shards` files of tf.train.Example with `label` (int64), `features` (the 64
  pixel values as a float list, the same numbers as the CSV) and `image` (a PNG of the digit
  upscaled to `--size` pixels, 0..255 grey); GZIP-compressed with --gzip;
- images: one folder per class (0..9) of PNG files of `--size` pixels.
`--copies K` repeats the training set K times (for channels of a chosen size in benchmarks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

KINDS = ("csv", "tfrecord", "images")


def split(validation_fraction: float = 0.2, seed: int = 0) -> dict[str, tuple]:
    """{"train": (pixels, labels), "validation": (...)}; pixels (n, 8, 8) in 0..16."""
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    cut = int(len(order) * (1 - validation_fraction))
    return {
        "train": (digits.images[order[:cut]], digits.target[order[:cut]]),
        "validation": (digits.images[order[cut:]], digits.target[order[cut:]]),
    }


def png_images(pixels: np.ndarray, size: int) -> list[bytes]:
    import tensorflow as tf

    grey = tf.constant(pixels[..., None] * (255 / 16), tf.float32)
    scaled = tf.cast(tf.round(tf.image.resize(grey, [size, size])), tf.uint8)
    return [tf.io.encode_png(image).numpy() for image in scaled]


def write_csv(folder: Path, pixels: np.ndarray, labels: np.ndarray) -> None:
    np.savetxt(
        folder / "digits.csv",
        np.column_stack([labels, pixels.reshape(len(labels), -1)]),
        delimiter=",",
        fmt="%g",
    )


def write_tfrecords(
    folder: Path,
    pixels: np.ndarray,
    labels: np.ndarray,
    size: int,
    shards: int,
    gzip: bool,
    copies: int,
) -> None:
    import tensorflow as tf

    pngs = png_images(pixels, size) * copies  # encoded once: PNG encoding is the slow part
    pixels, labels = np.concatenate([pixels] * copies), np.concatenate([labels] * copies)
    options = tf.io.TFRecordOptions(compression_type="GZIP" if gzip else "")
    for shard in range(shards):
        path = folder / f"digits-{shard:05d}-of-{shards:05d}.tfrecord"
        with tf.io.TFRecordWriter(str(path), options) as writer:
            for index in range(shard, len(labels), shards):
                writer.write(
                    tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                "label": tf.train.Feature(
                                    int64_list=tf.train.Int64List(value=[int(labels[index])])
                                ),
                                "features": tf.train.Feature(
                                    float_list=tf.train.FloatList(value=pixels[index].reshape(-1))
                                ),
                                "image": tf.train.Feature(
                                    bytes_list=tf.train.BytesList(value=[pngs[index]])
                                ),
                            }
                        )
                    ).SerializeToString()
                )


def write_images(
    folder: Path, pixels: np.ndarray, labels: np.ndarray, size: int, copies: int
) -> None:
    for index, (png, label) in enumerate(
        zip(png_images(pixels, size) * copies, np.concatenate([labels] * copies))
    ):
        (folder / str(label)).mkdir(exist_ok=True)
        (folder / str(label) / f"{index:06d}.png").write_bytes(png)


def write_digits(
    data_dir: Path,
    kind: str,
    *,
    size: int = 32,
    shards: int = 4,
    copies: int = 1,
    gzip: bool = False,
) -> None:
    """data_dir/train and data_dir/validation as `kind` files."""
    for channel, (pixels, labels) in split().items():
        repeat = copies if channel == "train" else 1
        folder = data_dir / channel
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "csv":
            write_csv(folder, np.concatenate([pixels] * repeat), np.concatenate([labels] * repeat))
        elif kind == "tfrecord":
            write_tfrecords(folder, pixels, labels, size, shards, gzip, repeat)
        else:
            write_images(folder, pixels, labels, size, repeat)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--gzip", action="store_true")
    args = parser.parse_args(argv)
    write_digits(
        args.out, args.kind, size=args.size, shards=args.shards, copies=args.copies, gzip=args.gzip
    )
    print(f"digits written as {args.kind} under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
