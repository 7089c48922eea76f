"""What a channel holds: its kind of files, and the CSV and NPZ readers, with errors that name
the file and the line.

Kinds, one per channel, chosen by file extension, or by the channel's ContentType for files
without a known extension (Spark's part-00000, for example):
- CSV (.csv, text/csv) without a header, label in the first column, one row per sample;
- NPZ (.npz, application/x-npz) with arrays `x` (samples first) and `y` (one label each);
- TFRecord (.tfrecord/.tfrecords/.tfrec, application/x-tfrecord), plain or GZIP (found from
  the file's first bytes, whatever its name), of tf.train.Example (see train/records.py);
- images (.jpg/.jpeg/.png, application/x-image): one subfolder per class, the convention of
  Keras' image_dataset_from_directory; the folder names are the classes.
Files are taken in sorted order; hidden files and names starting with `_` (such as Spark's
_SUCCESS) are skipped. A channel mixing kinds is refused: which format was meant is a guess.

CSV is streamed: a file is read and parsed CSV_CHUNK_LINES lines at a time, so a rank's memory
does not grow with the file. NPZ files are read one whole file at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from job.errors import ConfigError

CSV, NPZ, TFRECORD, IMAGE = "CSV", "NPZ", "TFRecord", "image"
EXTENSIONS = {
    ".csv": CSV,
    ".npz": NPZ,
    ".tfrecord": TFRECORD,
    ".tfrecords": TFRECORD,
    ".tfrec": TFRECORD,
    ".jpg": IMAGE,
    ".jpeg": IMAGE,
    ".png": IMAGE,
}
CONTENT_TYPES = {
    "text/csv": CSV,
    "application/x-npz": NPZ,
    "application/x-tfrecord": TFRECORD,
    "application/x-image": IMAGE,
    "image/jpeg": IMAGE,
    "image/png": IMAGE,
}
CSV_CHUNK_LINES = 65_536  # bounds the memory of one parsed piece of a large file


class DataError(ConfigError):
    """The data in a channel cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class ChannelFiles:
    """The data files of one channel and their kind; for images, each file's class name."""

    name: str
    directory: Path
    kind: str
    files: tuple[Path, ...]

    def class_name(self, path: Path) -> str:
        """The first folder under the channel's (deeper folders belong to that class)."""
        return path.relative_to(self.directory).parts[0]


def _kind(path: Path, content_type: str) -> str | None:
    return EXTENSIONS.get(path.suffix.lower()) or CONTENT_TYPES.get(
        content_type.split(";")[0].strip().lower()
    )


def list_channel(name: str, directory: Path, content_type: str = "") -> ChannelFiles:
    """The files of a channel folder and their one kind; DataError on anything unusable."""
    if not directory.is_dir():
        raise DataError(f"channel folder {directory} does not exist")
    files = sorted(
        p
        for p in directory.rglob("*")
        if p.is_file()
        and not any(part.startswith((".", "_")) for part in p.relative_to(directory).parts)
    )
    if not files:
        raise DataError(f"channel {name}: {directory} has no data files")
    kinds = {path: kind for path in files if (kind := _kind(path, content_type)) is not None}
    unknown = [p for p in files if p not in kinds]
    if unknown:
        raise DataError(
            f"{unknown[0]}: unsupported file type; channel files must be CSV, NPZ, "
            f"TFRecord or JPEG/PNG images (by extension: "
            f"{', '.join(EXTENSIONS)}), or set the channel's ContentType to one of "
            f"{', '.join(CONTENT_TYPES)}"
        )
    found = sorted(set(kinds.values()))
    if len(found) > 1:
        examples = ", ".join(
            f"{next(p for p, k in kinds.items() if k == kind).name} ({kind})" for kind in found
        )
        raise DataError(
            f"channel {name} mixes kinds of files: {examples}; put one kind of file in a channel"
        )
    channel = ChannelFiles(name, directory, found[0], tuple(files))
    if channel.kind == IMAGE:
        loose = [p for p in files if p.parent == directory]
        if loose:
            raise DataError(
                f"{loose[0]}: images must sit in one subfolder per class "
                f"({directory}/<class name>/<image>), not in the channel folder"
            )
    return channel


def _fast_table(lines: list[bytes], columns: int) -> np.ndarray | None:
    """The chunk as a float64 table through TensorFlow's decode_csv, or None for anything
    that needs a closer look. decode_csv converts numbers 2x faster than np.loadtxt (16k ->
    33k samples/s of 256 features on one core); the ranks import TensorFlow anyway."""
    import tensorflow as tf

    try:
        table = np.stack(
            [
                column.numpy()
                for column in tf.io.decode_csv(
                    [line.rstrip(b"\r\n") for line in lines],
                    [tf.constant([], tf.float64)] * columns,
                )
            ],
            axis=1,
        )
    except tf.errors.InvalidArgumentError:
        return None
    labels = table[:, 0]
    good = np.isfinite(table).all() and np.equal(np.mod(labels, 1), 0).all()
    return table if good else None


def _exact_table(path: Path, lines: list[bytes], first_line: int, columns: int) -> np.ndarray:
    """The chunk parsed line by line: skips blank lines, else the first problem with its line
    number (counted from 1, as an editor shows it)."""
    rows = []
    for number, line in enumerate(lines, first_line):
        text = line.strip()
        if not text:
            continue
        try:
            cells = text.decode("utf-8").split(",")
        except UnicodeDecodeError:
            raise DataError(
                f"{path}: line {number} is not UTF-8 text; CSV channel files hold "
                f"numbers separated by commas"
            ) from None
        if len(cells) != columns:
            raise DataError(
                f"{path}: line {number} has {len(cells)} columns but the file "
                f"starts with {columns}; every row needs the label and the same "
                f"number of features"
            )
        try:
            row = [float(cell) for cell in cells]
        except ValueError:
            column, cell = next((i + 1, c) for i, c in enumerate(cells) if not _is_number(c))
            raise DataError(
                f"{path}: line {number}, column {column}: {cell.strip()!r} is not "
                f"a number (CSV files have no header: the label, then numeric "
                f"features)"
            ) from None
        if not np.isfinite(row).all():
            raise DataError(f"{path}: line {number} has a NaN or infinite value")
        if row[0] != int(row[0]):
            raise DataError(
                f"{path}: line {number} has label {cells[0].strip()}; labels must "
                f"be integer class numbers"
            )
        rows.append(row)
    return np.array(rows, dtype=np.float64).reshape(len(rows), columns)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def csv_chunks(
    path: Path, chunk_lines: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(features float32, labels int64) of a CSV file, a chunk of lines at a time."""
    chunk_lines = chunk_lines or CSV_CHUNK_LINES
    columns, first_line = None, 1
    try:
        with open(path, "rb") as file:
            while lines := list(itertools.islice(file, chunk_lines)):
                if columns is None:
                    columns = next((line.count(b",") + 1 for line in lines if line.strip()), None)
                if columns is not None:
                    if columns < 2:
                        raise DataError(
                            f"{path}: each row needs a label and at least one "
                            f"feature, found {columns} column"
                        )
                    table = _fast_table(lines, columns)
                    if table is None:
                        table = _exact_table(path, lines, first_line, columns)
                    if len(table):
                        yield table[:, 1:].astype(np.float32), table[:, 0].astype(np.int64)
                first_line += len(lines)
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror})") from None
    if columns is None:
        raise DataError(f"{path}: the file is empty")


def npz_chunks(path: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(features float32, labels int64) of an NPZ file, the whole file as one chunk."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = {"x", "y"} - set(archive.files)
            if missing:
                raise DataError(
                    f"{path}: NPZ needs arrays x and y; missing "
                    f"{', '.join(sorted(missing))} (has {', '.join(archive.files)})"
                )
            x, y = archive["x"], archive["y"]
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a readable NPZ file ({error})") from None
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise DataError(
            f"{path}: x must be (samples, features...) and y (samples,) of the "
            f"same length; got x{x.shape} and y{y.shape}"
        )
    if len(y) == 0:
        raise DataError(f"{path}: the arrays are empty")
    if not (np.issubdtype(x.dtype, np.number) and np.issubdtype(y.dtype, np.number)):
        raise DataError(f"{path}: x and y must be numeric, got {x.dtype} and {y.dtype}")
    bad = np.nonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))[0]
    if len(bad):
        raise DataError(
            f"{path}: sample {bad[0] + 1} (counting from 1) has a NaN or infinite feature"
        )
    wrong = ~(np.isfinite(y) & np.equal(np.mod(y, 1), 0))
    if wrong.any():
        index = int(np.nonzero(wrong)[0][0])
        raise DataError(
            f"{path}: sample {index + 1} (counting from 1) has label {y[index]!r}; "
            f"labels must be integer class numbers"
        )
    yield x.astype(np.float32), y.astype(np.int64)
