"""Reading Keras 3 variables whose JAX arrays are split over devices, maybe of other processes.

A process reads a JAX array whole only where its own devices hold every piece of it; a
variable split over the devices of several processes (a model axis across hosts) is read
whole only by a collective that every process joins (`process_allgather`). Script mode's saves
(train.keras_script) and the built-in trainer's checkpoints, export and checks
(train.sync, train.trainer) read variables through here, so both say the same things:
- `local_whole` reads what this process can alone, and raises, naming the collective, where
  it cannot (never a first shard taken for the whole);
- `whole_value` is the collective read, `agree_fits` what checks first that the whole fits
  every host's memory (ModelTooLarge otherwise, saying what to do instead);
- `shard_digests` fingerprints this process's pieces by their place in the array, so that
  processes holding the same piece can compare it.
JAX is imported when these are called.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from job.errors import ConfigError


class ModelTooLarge(ConfigError):
    """What a save, an export or get_weights must hold at once does not fit some host's
    memory."""


Piece = tuple[tuple[Any, Any, Any], ...]  # (start, stop, step) per dimension


def piece(index: tuple[slice, ...]) -> Piece:
    return tuple((s.start, s.stop, s.step) for s in index)


def whole_in_every_process(indices_by_process: Mapping[int, set], processes: int) -> bool:
    """Whether each of `processes` holds every distinct piece of an array among its own
    devices (`indices_by_process`: process -> the pieces its devices hold), so that each reads
    it whole without a collective (JAX's own rule, applied to every process alike)."""
    pieces = set().union(*indices_by_process.values()) if indices_by_process else set()
    return all(indices_by_process.get(process, set()) == pieces for process in range(processes))


def spans_processes(array: Any) -> bool:
    """Whether reading this JAX array whole needs the other processes (the same answer on
    every process, from the sharding that all of them share). Anything else (a tf.Variable's
    `value`, on an image without JAX too) is not such an array: False, JAX not imported (no
    JAX array exists before it is). Not `hasattr(array, "addressable_shards")`: that property
    raises ValueError, not AttributeError, for arrays an accumulating optimizer keeps."""
    jax = sys.modules.get("jax")
    if jax is None or not isinstance(array, jax.Array) or array.is_fully_addressable:
        return False
    by_process: dict[int, set] = {}
    for device, index in array.sharding.devices_indices_map(array.shape).items():
        by_process.setdefault(device.process_index, set()).add(piece(index))
    return not whole_in_every_process(by_process, jax.process_count())


def local_whole(array: Any) -> np.ndarray:
    """The whole value of a JAX array from this process's own devices' pieces (no
    collective); RuntimeError where some piece lives only on another process's devices."""
    if array.is_fully_replicated:
        return np.asarray(array.addressable_data(0))
    whole = np.empty(array.shape, dtype=array.dtype)
    covered = np.zeros(array.shape, dtype=bool)
    for shard in array.addressable_shards:
        whole[shard.index] = np.asarray(shard.data)
        covered[shard.index] = True
    if not covered.all():
        raise RuntimeError(
            f"an array of shape {tuple(array.shape)} is split over devices of other processes "
            "too, so this process cannot read it alone: read it with "
            "train.jax_arrays.whole_value, which every process must call together"
        )
    return whole


def whole_value(array: Any) -> np.ndarray:
    """The whole value of a JAX array on every process: a collective when it spans processes
    (every process must call this for the same arrays, in the same order)."""
    if not spans_processes(array):
        return local_whole(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def local_pieces(array: Any) -> list[tuple[tuple[slice, ...], Any]]:
    """This process's pieces of a JAX array, as (global index, data); a replicated array is
    one piece, the whole, read by `addressable_data`: an accumulating optimizer's arrays raise
    ValueError from `addressable_shards`."""
    if array.is_fully_replicated:
        return [(tuple(slice(None) for _ in array.shape), array.addressable_data(0))]
    return [(shard.index, shard.data) for shard in array.addressable_shards]


def shard_digests(array: Any) -> dict[Piece, str]:
    """A digest of each distinct piece of a JAX array this process holds, by its place in the
    array (a replicated array: one piece, the whole)."""
    digests: dict[Piece, str] = {}
    for index, data in local_pieces(array):
        key = piece(index)
        if key not in digests:
            contiguous = np.ascontiguousarray(np.asarray(data))
            digests[key] = hashlib.sha256(contiguous.tobytes()).hexdigest()
    return digests


def differing_pieces(by_rank: list[dict[Any, str]]) -> dict[Any, list[str]]:
    """The pieces (train.sync.shard_digests' keys: a weight's index and a place in it) that the ranks holding them do not agree
    on: piece -> every holder's digest, in rank order."""
    held: dict[Any, list[str]] = {}
    for digests in by_rank:
        for place, digest in digests.items():
            held.setdefault(place, []).append(digest)
    return {place: digests for place, digests in held.items() if len(set(digests)) > 1}


def nbytes(variable: Any) -> int:
    size = 1
    for dimension in variable.shape:
        size *= int(dimension)
    return size * np.dtype(variable.dtype).itemsize


def available_memory(meminfo: str, cgroup_max: str | None, cgroup_stat: str | None) -> int:
    """Bytes this host can still give a process: MemAvailable, or less where a cgroup (the
    container's memory limit) allows less: its limit less its anonymous memory (its page
    cache counts in memory.current but is given back on demand, as MemAvailable counts it).
    The cgroup's files are v2's (memory.max, memory.stat's `anon`) or v1's
    (memory.limit_in_bytes, memory.stat's `total_rss`), as podman on a v1 host mounts them."""
    available = next(
        (
            int(line.split()[1]) * 1024
            for line in meminfo.splitlines()
            if line.startswith("MemAvailable:")
        ),
        0,
    )
    anonymous = next(
        (
            int(line.split()[1])
            for line in (cgroup_stat or "").splitlines()
            if line.startswith(("anon ", "total_rss "))
        ),
        None,
    )
    if cgroup_max and cgroup_max.strip().isdigit() and anonymous is not None:
        available = min(available, int(cgroup_max) - anonymous)
    return max(available, 0)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def host_memory() -> int:
    folder, limit = "/sys/fs/cgroup", _read("/sys/fs/cgroup/memory.max")
    if limit is None:  # cgroup v1: the memory controller's own folder
        folder = "/sys/fs/cgroup/memory"
        limit = _read(f"{folder}/memory.limit_in_bytes")
    return available_memory(_read("/proc/meminfo") or "", limit, _read(f"{folder}/memory.stat"))


def gib(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def too_large(
    call: str, what: str, need: int, hosts: list[tuple[int, int]], instead: str
) -> str | None:
    """Why `call` cannot hold `what` (`need` bytes) at once, given each process's (index,
    bytes available) on its host, ending with what to do `instead`; None when every one can."""
    short = [(process, free) for process, free in hosts if free < need]
    if not short:
        return None
    process, free = short[0]
    return (
        f"{call} gathers {what} ({gib(need)}) onto every process, but process {process}'s "
        f"host has {gib(free)} of memory free. {instead}"
    )


def agree_fits(call: str, what: str, need: int, instead: str) -> None:
    """With every process (a collective): ModelTooLarge on all of them unless `need` bytes fit
    each host's free memory."""
    from jax.experimental import multihost_utils

    # In MiB, as int32: JAX without x64 (its default) turns an int64 into an int32, and
    # bytes above 2 GiB wrapped round to negative numbers (measured).
    free = multihost_utils.process_allgather(np.array([host_memory() >> 20], dtype=np.int32))
    hosts = [(process, int(mib) << 20) for process, mib in enumerate(np.ravel(free))]
    reason = too_large(call, what, need, hosts, instead)
    if reason:
        raise ModelTooLarge(reason)
