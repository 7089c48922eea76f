"""Which part of a channel one rank reads: its own files when there are enough, else every
W-th record.

A FullyReplicated channel is identical on every host, so it is split over all ranks (reader =
global rank); a ShardedByS3Key channel already differs per host, so it is split over the host's
local ranks only. With at least as many files as readers, reader r of W reads files r, r+W, ...
and nothing else (the I/O scales with the ranks); with fewer files, every reader reads all of
them and keeps records r, r+W, ... of their concatenation. Shares may differ in size; the
trainer makes every rank run the same number of steps anyway (an uneven step count would hang
Horovod's allreduce).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Share:
    """Files to read, and which of their records to keep: global index % step == offset."""

    files: tuple[Path, ...]
    offset: int = 0
    step: int = 1

    @property
    def by_file(self) -> bool:
        return self.step == 1


def readers(
    *, by_host: bool, rank: int, world_size: int, local_rank: int, local_size: int
) -> tuple[int, int]:
    """(this reader's index, number of readers) of a channel."""
    return (local_rank, local_size) if by_host else (rank, world_size)


def assign(files: tuple[Path, ...], reader: int, count: int) -> Share:
    if len(files) >= count:
        return Share(files[reader::count])
    return Share(files, reader, count)
