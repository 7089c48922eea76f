"""Reading channel files and giving each rank its share, with errors that name the file.

Formats (what SageMaker's built-in algorithms use, and what numpy writes):
- CSV without a header, label in the first column, one row per sample.
- NPZ with arrays `x` (samples first) and `y` (one label per sample).
Files are read in sorted order; hidden files and names starting with `_` (such as Spark's
_SUCCESS) are skipped.

Sharding: a FullyReplicated channel is identical on every host, so rank r of W keeps rows
r, r+W, ...; a ShardedByS3Key channel already differs per host, so it is split over the
host's local ranks only. Shard sizes may differ; the trainer makes every rank run the same
number of steps anyway (an uneven step count would hang Horovod's allreduce).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from container.errors import ConfigError

FORMATS = {".csv": "CSV", ".npz": "NPZ"}


class DataError(ConfigError):
    """The data in a channel cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Dataset:
    x: np.ndarray  # float32, samples first
    y: np.ndarray  # int64 labels
    files: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.y)

    def take(self, start: int, step: int) -> "Dataset":
        return Dataset(self.x[start::step], self.y[start::step], self.files)


def channel_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise DataError(f"channel folder {directory} does not exist")
    files = sorted(p for p in directory.rglob("*") if p.is_file()
                   and not p.name.startswith((".", "_")))
    unsupported = [p for p in files if p.suffix.lower() not in FORMATS]
    if unsupported:
        raise DataError(f"{unsupported[0]}: unsupported file type; channel files must be "
                        f"{' or '.join(f'{v} ({k})' for k, v in FORMATS.items())}")
    return files


CSV_CHUNK_LINES = 65_536  # bounds the memory of the split lines of a large file


def _parse_csv_fast(path: Path) -> np.ndarray | None:
    """The table of a well-formed CSV, or None for anything else.

    TensorFlow's decode_csv converts numbers 2x faster than np.loadtxt (issue 6: 16k -> 33k
    samples/s of 256 features on one core); the ranks import TensorFlow anyway. It is only
    the fast path: a file it refuses (blank lines, ragged rows, text) is left to np.loadtxt,
    whose errors name the row and column.
    """
    import tensorflow as tf

    lines = path.read_bytes().splitlines()
    if not lines:
        return None
    columns = lines[0].count(b",") + 1
    defaults = [tf.constant([], tf.float64)] * columns
    try:
        chunks = [np.stack([column.numpy() for column in
                            tf.io.decode_csv(lines[start:start + CSV_CHUNK_LINES], defaults)],
                           axis=1)
                  for start in range(0, len(lines), CSV_CHUNK_LINES)]
    except tf.errors.InvalidArgumentError:
        return None
    return np.concatenate(chunks)


def read_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    table = _parse_csv_fast(path)
    if table is None:
        try:
            table = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2,
                               encoding="utf-8")
        except (ValueError, UnicodeDecodeError) as error:
            raise DataError(f"{path}: not a numeric CSV without header ({error})") from None
    if table.size == 0:
        raise DataError(f"{path}: the file is empty")
    if table.shape[1] < 2:
        raise DataError(f"{path}: each row needs a label and at least one feature, found "
                        f"{table.shape[1]} column")
    return table[:, 1:], table[:, 0]


def read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = {"x", "y"} - set(archive.files)
            if missing:
                raise DataError(f"{path}: NPZ needs arrays x and y; missing "
                                f"{', '.join(sorted(missing))} (has {', '.join(archive.files)})")
            x, y = archive["x"], archive["y"]
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a readable NPZ file ({error})") from None
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise DataError(f"{path}: x must be (samples, features...) and y (samples,) of the "
                        f"same length; got x{x.shape} and y{y.shape}")
    if len(y) == 0:
        raise DataError(f"{path}: the arrays are empty")
    if not (np.issubdtype(x.dtype, np.number) and np.issubdtype(y.dtype, np.number)):
        raise DataError(f"{path}: x and y must be numeric, got {x.dtype} and {y.dtype}")
    return x, y  # _checked converts to float32 once (no float64 copy of the whole channel)


def _checked(path: Path, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bad_rows = np.nonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))[0]
    if len(bad_rows):
        raise DataError(f"{path}: row {bad_rows[0] + 1} has a NaN or infinite feature")
    if not np.isfinite(y).all() or not np.equal(np.mod(y, 1), 0).all():
        row = int(np.nonzero(~(np.isfinite(y) & np.equal(np.mod(y, 1), 0)))[0][0])
        raise DataError(f"{path}: row {row + 1} has label {y[row]!r}; labels must be integer "
                        f"class numbers")
    return x.astype(np.float32), y.astype(np.int64)


def read_channel(directory: Path) -> Dataset:
    """All files of one channel, concatenated; DataError on anything unusable."""
    files = channel_files(directory)
    if not files:
        raise DataError(f"channel folder {directory} has no CSV or NPZ files")
    parts = []
    for path in files:
        reader = read_csv if path.suffix.lower() == ".csv" else read_npz
        parts.append((path, *_checked(path, *reader(path))))
    first_path, first_x, _ = parts[0]
    for path, x, _ in parts[1:]:
        if x.shape[1:] != first_x.shape[1:]:
            raise DataError(f"{path}: samples have shape {x.shape[1:]} but {first_path} has "
                            f"{first_x.shape[1:]}; all files of a channel must match")
    return Dataset(np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]),
                   tuple(str(p[0]) for p in parts))


def shard(data: Dataset, *, by_host: bool, rank: int, world_size: int, local_rank: int,
          local_size: int) -> Dataset:
    """This rank's share of a channel (see the module docstring)."""
    return data.take(local_rank, local_size) if by_host else data.take(rank, world_size)
