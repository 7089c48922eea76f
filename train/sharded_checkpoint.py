"""Sharded checkpoints for models split across hosts, in a layout SageMaker's disks can hold.

Why not one file from the leader: a model whose variables are split over the devices of
several processes (Keras 3 `ModelParallel` with the model axis across hosts) cannot be read by
one process (JAX: "Fetching value for jax.Array that spans non-addressable devices"), and
gathering it onto one host is what model parallelism exists to avoid. Why not Orbax's
multi-host save: it expects one folder that every process sees, and SageMaker gives each host
its own `/opt/ml/checkpoints`; each host's copy is uploaded to the same S3 prefix, and at the
next start the whole prefix is restored into every host (docs/tensorflow-2.21.md, "Sharded
checkpoints", has the measurements).

So every process writes, into its own host's checkpoint folder, only the shards it holds:

    <checkpoint>/shards/process-00001-of-00002.npz    this process's shards, one array each
    <checkpoint>/shards/process-00001-of-00002.json   its index, written last

- A shard held by several devices (replicated, or split on an axis inside each process only)
  is written once, by the lowest process holding it; every process knows who holds what from
  the sharding alone (`owned_regions`), without talking to the others.
- File names carry the process and the process count, so no two hosts ever write the same
  name, and the union of every host's folder (S3's merge) is the whole checkpoint.
- Each file is written as `.<name>.partial` and renamed: a name in place holds a complete write.
  The index, renamed after the data, records the data file's size and every variable's global
  shape and dtype and each shard's global slice: its presence is this process's confirmation.
- A checkpoint is read only when every process's index and data file are there, at their
  recorded size, and together cover every variable exactly once (`read_manifest`); else
  `IncompleteCheckpoint` names what is missing, so a half-synced prefix is never used.
- Reading reshards: for each block a device of the current model needs (another mesh, another
  process count) the overlapping stored shards are copied into place (`Manifest.assemble`);
  a process whose model is not split across processes reads each variable whole
  (`read_whole`).
- A restart inside the job (`max_restarts`) finds each host holding only its own files: S3
  merges them only at the next start. Before reading, the processes send each other the files
  their hosts lack (`share_files`), so that every host holds what S3's merge would give it.

The index logic and file I/O here need only NumPy (the unit tests run without JAX); the JAX
part (`save_arrays`, `restore_arrays`, `save_variables`, `restore_variables`) imports JAX when
called.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from job.errors import ConfigError

FORMAT = 1
SHARDS = "shards"
_FILE = re.compile(r"process-(?P<process>\d{5})-of-(?P<processes>\d{5})\.(?P<kind>json|npz)$")

# A global slice of a variable: (start, stop) per dimension.
Region = tuple[tuple[int, int], ...]


class IncompleteCheckpoint(ConfigError):
    """A sharded checkpoint that cannot be read whole here: a process's file missing or cut
    short (a half-synced S3 prefix), shards that do not cover a variable, or a model whose
    variables it does not hold. A job restarted on it exits 2 with this message."""


# ---- regions: which part of a variable a shard is ------------------------------------------


def region_of(index: Sequence[slice], shape: Sequence[int]) -> Region:
    """A shard's global slice (JAX's `shard.index`, a tuple of slices with None for "whole")
    as (start, stop) per dimension. A scalar's only region is ()."""
    if len(index) != len(shape):
        raise ValueError(f"index {index} has {len(index)} dimensions, the shape {tuple(shape)}")
    region = []
    for part, size in zip(index, shape):
        start, stop, step = part.indices(size)
        if step != 1:
            raise ValueError(f"index {index}: a shard is a contiguous block, not step {step}")
        region.append((start, stop))
    return tuple(region)


def whole(shape: Sequence[int]) -> Region:
    return tuple((0, size) for size in shape)


def volume(region: Region) -> int:
    return math.prod(stop - start for start, stop in region)


def intersection(a: Region, b: Region) -> Region | None:
    """The block two regions share, or None when they share nothing."""
    shared = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return shared if all(start < stop for start, stop in shared) else None


def as_slices(region: Region, origin: Region | None = None) -> tuple[slice, ...]:
    """Slices that pick `region` out of an array that holds `origin` (default: from zero)."""
    offsets = [start for start, _ in origin] if origin else [0] * len(region)
    return tuple(slice(start - at, stop - at) for (start, stop), at in zip(region, offsets))


def owned_regions(holders: Iterable[tuple[int, Region]], process: int) -> list[Region]:
    """The distinct regions that `process` writes, given every (process, region) pair of a
    variable (one per device of its sharding): each region once, by the lowest process that
    holds it, so a replicated shard is written by one process, and only once by it even when
    several of its devices hold it. Sorted, so every run writes them in the same order."""
    lowest: dict[Region, int] = {}
    for holder, region in holders:
        lowest[region] = min(holder, lowest.get(region, holder))
    return sorted(region for region, holder in lowest.items() if holder == process)


# ---- the files ------------------------------------------------------------------------------


def file_stem(process: int, processes: int) -> str:
    if not 0 <= process < processes:
        raise ValueError(f"process {process} is not one of {processes} processes")
    return f"process-{process:05d}-of-{processes:05d}"


@dataclass(frozen=True)
class VariableSpec:
    """A variable as the checkpoint records it: its name (Keras's `variable.path`), global
    shape and dtype name (NumPy's, or ml_dtypes' such as bfloat16)."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Shard:
    """One stored block: the variable's name, its global region, and where it is (which
    process's file, under which key)."""

    name: str
    region: Region
    process: int
    key: str


@dataclass(frozen=True)
class ProcessIndex:
    """What one process wrote: every variable of the checkpoint (each process lists all of
    them, so any one index tells what the whole must hold), its own shards, and its data
    file's size (a shorter file is a half-synced copy)."""

    process: int
    processes: int
    variables: tuple[VariableSpec, ...]
    shards: tuple[Shard, ...]
    data_bytes: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "process": self.process,
                "processes": self.processes,
                "data_bytes": self.data_bytes,
                "variables": [
                    {"name": v.name, "shape": list(v.shape), "dtype": v.dtype}
                    for v in self.variables
                ],
                "shards": [
                    {"name": s.name, "key": s.key, "region": [list(r) for r in s.region]}
                    for s in self.shards
                ],
            },
            indent=1,
        )

    @staticmethod
    def from_json(text: str) -> ProcessIndex:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this code reads format {FORMAT}")
        process = int(data["process"])
        return ProcessIndex(
            process=process,
            processes=int(data["processes"]),
            variables=tuple(
                VariableSpec(v["name"], tuple(v["shape"]), v["dtype"]) for v in data["variables"]
            ),
            shards=tuple(
                Shard(s["name"], tuple((int(a), int(b)) for a, b in s["region"]), process, s["key"])
                for s in data["shards"]
            ),
            data_bytes=int(data["data_bytes"]),
        )


def dtype_named(name: str) -> np.dtype:
    """NumPy's dtype of that name, or ml_dtypes' (bfloat16, float8_*), which NumPy lacks."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # JAX's own dependency; only a checkpoint of such a dtype needs it

        return np.dtype(getattr(ml_dtypes, name))


def _storable(array: np.ndarray) -> np.ndarray:
    """An array .npz can hold and give back: ml_dtypes' types (bfloat16) go in as unsigned
    integers of their width (the index keeps the real dtype, and reading views them back)."""
    if array.dtype.type.__module__ == "numpy":
        return array
    return array.view(f"u{array.dtype.itemsize}")


def _write_replacing(path: Path, write: Callable[[Any], None]) -> None:
    """Write `path` as `.<name>.partial` beside it, flushed to disk, then rename it into place:
    the name exists only with its whole content."""
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as out:
        write(out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def write_process_files(
    folder: Path,
    process: int,
    processes: int,
    variables: Sequence[VariableSpec],
    blocks: Sequence[tuple[str, Region, np.ndarray]],
) -> ProcessIndex:
    """Write this process's data file (its blocks: variable name, global region, values) and
    then its index into `folder`/shards/. Every process calls it with the same `variables`."""
    shards_folder = Path(folder) / SHARDS
    shards_folder.mkdir(parents=True, exist_ok=True)
    stem = file_stem(process, processes)
    specs = {spec.name: spec for spec in variables}
    arrays: dict[str, np.ndarray] = {}
    shards = []
    for number, (name, region, block) in enumerate(blocks):
        values = np.asarray(block)
        expected = tuple(stop - start for start, stop in region)
        if name not in specs or values.shape != expected:
            raise ValueError(f"block {name} {region}: values of shape {values.shape}")
        key = f"s{number}"
        arrays[key] = _storable(values)
        shards.append(Shard(name, region, process, key))
    data = shards_folder / f"{stem}.npz"
    _write_replacing(data, lambda out: np.savez(out, **arrays))
    index = ProcessIndex(process, processes, tuple(variables), tuple(shards), data.stat().st_size)
    _write_replacing(
        shards_folder / f"{stem}.json", lambda out: out.write(index.to_json().encode())
    )
    return index


# ---- reading: is it whole, and assembling blocks ---------------------------------------------


@dataclass
class Manifest:
    """A whole sharded checkpoint: every variable, every shard and where it lies. Made by
    `read_manifest`, which checked it is whole; `assemble` reads any block of a variable."""

    folder: Path
    processes: int
    variables: dict[str, VariableSpec]
    shards: dict[str, list[Shard]]
    _open: dict[int, Any] = field(default_factory=dict, repr=False)
    _cache: dict[tuple[int, str], np.ndarray] = field(default_factory=dict, repr=False)
    _cached_name: str | None = field(default=None, repr=False)

    def assemble(self, name: str, region: Region) -> np.ndarray:
        """The values of `region` of variable `name`, from every stored shard that overlaps
        it (one when the mesh is the one that saved it; several, or part of one, after a
        reshard). Only the files holding those shards are opened."""
        spec = self.variables[name]
        dtype = dtype_named(spec.dtype)
        out = np.empty(tuple(stop - start for start, stop in region), dtype=dtype)
        if volume(region) == 0:
            return out
        covered = 0
        for shard in self.shards[name]:
            shared = intersection(region, shard.region)
            if shared is not None:
                stored = self._stored(shard).view(dtype)
                out[as_slices(shared, region)] = stored[as_slices(shared, shard.region)]
                covered += volume(shared)
        if covered != volume(region):
            raise IncompleteCheckpoint(  # read_manifest checked coverage: a changed file
                f"{self.folder}: the shards of {name} cover {covered} of the {volume(region)} "
                f"values of {region}"
            )
        return out

    def _stored(self, shard: Shard) -> np.ndarray:
        """A stored shard's values, kept while blocks of the same variable are assembled
        (another mesh needs parts of one stored shard on several devices: read it once)."""
        if self._cached_name != shard.name:
            self._cache.clear()
            self._cached_name = shard.name
        key = (shard.process, shard.key)
        if key not in self._cache:
            self._cache[key] = self._data(shard.process)[shard.key]
        return self._cache[key]

    def _data(self, process: int):
        if process not in self._open:
            path = self.folder / SHARDS / f"{file_stem(process, self.processes)}.npz"
            self._open[process] = np.load(path)
        return self._open[process]

    def close(self) -> None:
        for data in self._open.values():
            data.close()
        self._open.clear()
        self._cache.clear()

    def check_holds(self, wanted: Sequence[VariableSpec]) -> None:
        """Raise IncompleteCheckpoint naming every variable of the model that the checkpoint
        lacks or holds with another shape or dtype (a changed model)."""
        problems = []
        for spec in wanted:
            have = self.variables.get(spec.name)
            if have is None:
                problems.append(f"{spec.name} is not in it")
            elif (have.shape, have.dtype) != (tuple(spec.shape), spec.dtype):
                problems.append(
                    f"{spec.name} is {have.dtype}{list(have.shape)} there, "
                    f"{spec.dtype}{list(spec.shape)} in the model"
                )
        if problems:
            raise IncompleteCheckpoint(
                f"checkpoint {self.folder} does not fit the model: {_first(problems)} "
                "(the checkpoint was written by another model: restore into the same "
                "model, or start from another checkpoint folder)"
            )


def _first(problems: list[str], count: int = 5) -> str:
    more = f"; and {len(problems) - count} more" if len(problems) > count else ""
    return "; ".join(problems[:count]) + more


def read_manifest(folder: Path) -> Manifest:
    """The checkpoint in `folder` when it is whole: every process's index and data file
    present at their recorded size, all indexes listing the same variables, and the shards
    covering each variable exactly once. Else IncompleteCheckpoint naming what is missing:
    a checkpoint whose last host has not been synced yet is not used."""
    folder = Path(folder)
    shards_folder = folder / SHARDS
    found: dict[int, dict[int, set[str]]] = {}  # processes -> process -> kinds
    if shards_folder.is_dir():
        for path in shards_folder.iterdir():
            match = _FILE.match(path.name)
            if match:
                kinds = found.setdefault(int(match["processes"]), {})
                kinds.setdefault(int(match["process"]), set()).add(match["kind"])
    if not found:
        raise IncompleteCheckpoint(f"{folder} holds no sharded checkpoint ({SHARDS}/ is empty)")
    if len(found) > 1:
        raise IncompleteCheckpoint(
            f"{shards_folder} holds files of {sorted(found)} processes: two jobs wrote one folder"
        )
    [(processes, present)] = found.items()
    missing = [
        f"{file_stem(p, processes)}.{kind}"
        for p in range(processes)
        for kind in ("json", "npz")
        if kind not in present.get(p, set())
    ]
    if missing:
        raise IncompleteCheckpoint(
            f"checkpoint {folder} is incomplete: {len(missing)} of {2 * processes} files "
            f"missing ({_first(missing)}); each process writes its own, so a host's copy has "
            "not reached it (SageMaker syncs each host's checkpoint folder to S3 on its own)"
        )
    indexes = []
    for process in range(processes):
        stem = file_stem(process, processes)
        try:
            index = ProcessIndex.from_json((shards_folder / f"{stem}.json").read_text())
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise IncompleteCheckpoint(
                f"{shards_folder}/{stem}.json cannot be read: {error}"
            ) from error
        if (index.process, index.processes) != (process, processes):
            raise IncompleteCheckpoint(
                f"{shards_folder}/{stem}.json is process {index.process} of {index.processes}'s"
            )
        size = (shards_folder / f"{stem}.npz").stat().st_size
        if size != index.data_bytes:
            raise IncompleteCheckpoint(
                f"{shards_folder}/{stem}.npz holds {size} of its {index.data_bytes} bytes: a "
                "partial copy"
            )
        indexes.append(index)
    variables = {spec.name: spec for spec in indexes[0].variables}
    for index in indexes[1:]:
        if index.variables != indexes[0].variables:
            raise IncompleteCheckpoint(
                f"checkpoint {folder}: process {index.process} lists other variables than "
                "process 0 (files of two different checkpoints)"
            )
    shards: dict[str, list[Shard]] = {name: [] for name in variables}
    for index in indexes:
        for shard in index.shards:
            if shard.name not in shards:
                raise IncompleteCheckpoint(f"{folder}: a shard of unlisted variable {shard.name}")
            shards[shard.name].append(shard)
    problems = [
        problem
        for name, spec in variables.items()
        if (problem := _coverage_problem(spec, shards[name]))
    ]
    if problems:
        raise IncompleteCheckpoint(f"checkpoint {folder} does not hold: {_first(problems)}")
    return Manifest(folder, processes, variables, shards)


def _coverage_problem(spec: VariableSpec, shards: list[Shard]) -> str | None:
    """Why the shards do not cover the variable exactly once, or None when they do."""
    bounds = whole(spec.shape)
    for shard in shards:
        inside = len(shard.region) == len(bounds) and all(
            0 <= start <= stop <= size for (start, stop), (_, size) in zip(shard.region, bounds)
        )
        if not inside:
            return f"{spec.name}: shard {list(shard.region)} lies outside {list(spec.shape)}"
    for number, a in enumerate(shards):
        for b in shards[number + 1 :]:
            if volume(a.region) and intersection(a.region, b.region) is not None:
                return f"{spec.name}: shards {a.region} and {b.region} overlap"
    stored = sum(volume(shard.region) for shard in shards)
    if not shards or stored != volume(bounds):
        return f"{spec.name}: its shards hold {stored} of its {volume(bounds)} values"
    return None


def is_sharded(folder: Path) -> bool:
    """Whether a checkpoint folder holds a sharded checkpoint (else the leader's whole one)."""
    return (Path(folder) / SHARDS).is_dir()


def read_whole(folder: Path, wanted: Sequence[VariableSpec]) -> list[np.ndarray]:
    """The whole value of each of `wanted` (named as `save_variables` names them) from the
    sharded checkpoint in `folder`, for a process that holds a whole model (a job resumed
    without a model axis across processes: another instance count or mesh). Needs every
    process's files here, as S3 restores them; IncompleteCheckpoint otherwise."""
    manifest = read_manifest(folder)
    try:
        manifest.check_holds(wanted)
        return [manifest.assemble(spec.name, whole(spec.shape)) for spec in wanted]
    finally:
        manifest.close()


# ---- sharing the files of a checkpoint between hosts ----------------------------------------

# A file travels in pieces of at most this many bytes (MPI counts in 32-bit integers).
CHUNK = 64 * 2**20
# A file one process needs from another: (its name in shards/, from which process, to which).
Transfer = tuple[str, int, int]


def held_files(folder: Path) -> dict[str, int]:
    """The complete shard files in `folder`/shards/ (name -> bytes): names in place only."""
    shards_folder = Path(folder) / SHARDS
    if not shards_folder.is_dir():
        return {}
    return {p.name: p.stat().st_size for p in shards_folder.iterdir() if _FILE.match(p.name)}


def transfers(held: Sequence[dict[str, int]]) -> list[Transfer]:
    """Who sends which file to whom, given the files each process's folder holds (in process
    order): each file some process lacks comes from the lowest process holding it with the
    largest size (a shorter copy is a partial one), in one order that every process computes
    alike. Processes sharing a disk all lack the same files, and each writes its copy."""
    names = sorted(set().union(*held))
    plan: list[Transfer] = []
    for name in names:
        largest = max(files.get(name, -1) for files in held)
        source = next(p for p, files in enumerate(held) if files.get(name) == largest)
        plan.extend((name, source, p) for p, files in enumerate(held) if files.get(name) != largest)
    return plan


def share_files(folder: Path, comm: Any) -> list[str]:
    """Every process calls it (a collective over `comm`, mpi4py's communicator): afterwards
    each process's `folder`/shards/ holds every shard file that any process's copy holds, as
    after S3's merge; the names this process received. A file received is written aside and
    renamed, under a name of this process's own (another process of the host may write it
    too), so a name in place always holds a whole file."""
    rank = comm.Get_rank()
    held = comm.allgather(held_files(folder))
    received = []
    for name, source, target in transfers(held):
        path = Path(folder) / SHARDS / name
        if rank == source:
            with open(path, "rb") as data:
                for _ in range(0, held[source][name], CHUNK):
                    comm.send(data.read(CHUNK), dest=target)
        elif rank == target:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{name}.partial-{rank}")
            with open(partial, "wb") as out:
                for _ in range(0, held[source][name], CHUNK):
                    out.write(comm.recv(source=source))
            os.replace(partial, path)
            received.append(name)
    return received


# ---- JAX: this process's shards of global arrays --------------------------------------------


def unique_names(names: Sequence[str]) -> list[str]:
    """Names made unique by a `#k` suffix on repeats, in order (a model's variable paths are
    unique in Keras 3; this keeps a checkpoint correct where they are not)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        out.append(name if count == 0 else f"{name}#{count}")
    return out


def save_arrays(folder: Path, named: Sequence[tuple[str, Any]]) -> ProcessIndex:
    """Every process calls it with the same (name, jax.Array) pairs: it writes this
    process's shards of each array (those it is the lowest holder of) and its index into
    `folder`. No collective: nothing waits for the other processes; the caller confirms
    the checkpoint (the leader's agreement) once every process returned."""
    import jax

    from train.jax_arrays import local_pieces

    process, processes = jax.process_index(), jax.process_count()
    variables: list[VariableSpec] = []
    blocks: list[tuple[str, Region, np.ndarray]] = []
    for name, array in named:
        shape = tuple(array.shape)
        variables.append(VariableSpec(name, shape, np.dtype(array.dtype).name))
        holders = [
            (device.process_index, region_of(index, shape))
            for device, index in array.sharding.devices_indices_map(shape).items()
        ]
        local = {region_of(index, shape): data for index, data in local_pieces(array)}
        blocks.extend(
            (name, region, np.asarray(local[region])) for region in owned_regions(holders, process)
        )
    return write_process_files(folder, process, processes, variables, blocks)


def restore_arrays(folder: Path, targets: Sequence[tuple[str, Any]]) -> list:
    """Global jax.Arrays of the checkpoint in `folder`, one per (name, target), each with its
    target's shape, dtype and sharding (a jax.Array or jax.ShapeDtypeStruct with a sharding,
    of any mesh and process count): this process reads only the blocks its own devices hold.
    IncompleteCheckpoint when the checkpoint is not whole or does not fit the targets."""
    import jax

    manifest = read_manifest(folder)
    try:
        manifest.check_holds(
            [VariableSpec(name, tuple(t.shape), np.dtype(t.dtype).name) for name, t in targets]
        )
        arrays = []
        for name, target in targets:
            shape, sharding = tuple(target.shape), target.sharding
            blocks = [
                jax.device_put(manifest.assemble(name, region_of(index, shape)), device)
                for device, index in sharding.addressable_devices_indices_map(shape).items()
            ]
            arrays.append(jax.make_array_from_single_device_arrays(shape, sharding, blocks))
        return arrays
    finally:
        manifest.close()


def save_variables(folder: Path, variables: Sequence) -> ProcessIndex:
    """`save_arrays` of Keras 3 variables (on JAX), named by their paths."""
    names = unique_names([variable.path for variable in variables])
    return save_arrays(folder, [(n, v.value) for n, v in zip(names, variables)])


def variable_specs(variables: Sequence) -> list[VariableSpec]:
    """Keras 3 variables as `save_variables` records them (for `read_whole`)."""
    names = unique_names([variable.path for variable in variables])
    return [
        VariableSpec(name, tuple(v.value.shape), np.dtype(v.value.dtype).name)
        for name, v in zip(names, variables)
    ]


def restore_variables(folder: Path, variables: Sequence) -> None:
    """Assign a sharded checkpoint to Keras 3 variables (on JAX), each in its own sharding.
    Every process calls it; each assigns arrays already laid out as the variable is, so
    Keras keeps them as they are (no transfer, no check across processes)."""
    names = unique_names([variable.path for variable in variables])
    arrays = restore_arrays(folder, [(n, v.value) for n, v in zip(names, variables)])
    for variable, array in zip(variables, arrays):
        variable.assign(array)
