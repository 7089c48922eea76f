"""Checkpoints that survive a kill at any moment, and resuming from the newest usable one.

Rank 0 writes each checkpoint into a temporary folder, records the state last, and renames the
folder into place: a rename is atomic, so a folder named `epoch-NNNNNN` holds a complete write
and a torn `.tmp-*` folder left by a kill is ignored and removed on the next start. The same
epoch saved again (a stop mid-epoch, then a resume; checkpoints every few minutes inside a long
epoch) goes to `epoch-NNNNNN.K`, K one more than any copy of that epoch there, and the older
folder is pruned only after it is in place: at no moment is there no checkpoint.

What was written completely can still arrive broken: SageMaker syncs /opt/ml/checkpoints
with S3 in the background, so a spot reclaim can leave a partial copy (a state file without
its variables, a truncated variables file). `resume` therefore tries the newest folder first
and falls back, one by one, to older ones, logging which it skipped and why. Names carry no
host, because only rank 0 writes (SageMaker merges every host's checkpoints in S3).

A model split across processes (Keras 3 on JAX with a model axis across hosts) is the
exception: no process can read it whole, so every process writes its own shards into its own
host's copy of the folder (train.sharded_checkpoint, `ShardedCheckpoints`) and the leader's
state, written once all confirmed, makes it count. Which of the two a model gets is decided
once, here (`checkpoints_for`), for the built-in trainer and for scripts' train.resumable.
Either reads the other's folders: a job resumed with another mesh or instance count goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from job.checkpoint_folders import PREFIX, STATE, complete, is_checkpoint_name, newest_usable, order
from train.sharded_checkpoint import is_sharded, read_whole, variable_specs

if TYPE_CHECKING:  # train.sync starts MPI when imported: not for the unit tests of this module
    from train.sync import OverMpi, Sync


class CheckpointStore:
    def __init__(self, directory: Path, keep: int):
        self.directory = directory
        self.keep = keep

    def clean_torn(self) -> None:
        for torn in self.directory.glob(".tmp-*"):
            shutil.rmtree(torn, ignore_errors=True)

    def save(self, checkpoint: tf.train.Checkpoint, epochs_done: int, **state) -> Path:
        final = self.next_folder(epochs_done)
        temporary = self.directory / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(temporary, ignore_errors=True)
        checkpoint.write(str(temporary / "ckpt"))
        (temporary / STATE).write_text(json.dumps({"epochs_done": epochs_done, **state}))
        os.replace(temporary, final)
        self.prune()
        return final

    def next_folder(self, epochs_done: int) -> Path:
        """The name the next checkpoint of `epochs_done` epochs takes (the folder made ready):
        after the copies of this epoch already there, even once older ones were pruned, since
        a reused lower number would sort as the oldest and be pruned at once."""
        self.directory.mkdir(parents=True, exist_ok=True)
        copies = [
            order(p)[1]
            for p in self.directory.iterdir()
            if is_checkpoint_name(p.name) and order(p)[0] == epochs_done
        ]
        again = max(copies) + 1 if copies else 0
        return self.directory / (f"{PREFIX}{epochs_done:06d}" + (f".{again}" if again else ""))

    def confirm(self, folder: Path, epochs_done: int, **state) -> None:
        """Write the state of a checkpoint whose variables are in `folder` already (a sharded
        checkpoint, written by every process into its own host's folder): written aside and
        renamed, it makes the folder count (job.checkpoint_folders.complete)."""
        partial = folder / f".{STATE}.partial"
        partial.write_text(json.dumps({"epochs_done": epochs_done, **state}))
        os.replace(partial, folder / STATE)

    def prune(self) -> list[str]:
        """Remove all but the `keep` newest complete checkpoints; the names removed."""
        old = complete(self.directory)[: -self.keep]
        for folder in old:
            shutil.rmtree(folder, ignore_errors=True)
        return [folder.name for folder in old]

    def resume(
        self, checkpoint: tf.train.Checkpoint, log: Callable[[str], None]
    ) -> tuple[Path, dict] | None:
        """Restore the newest checkpoint that reads back; (folder, state), or None if none.
        The pick is job.checkpoint_folders', the one the launcher names after a stop."""
        return newest_usable(self.directory, lambda folder: self.restore(checkpoint, folder), log)

    @staticmethod
    def restore(checkpoint: tf.train.Checkpoint, folder: Path) -> None:
        checkpoint.read(str(folder / "ckpt")).assert_existing_objects_matched()


class ArrayCheckpoint:
    """tf.train.Checkpoint's write and read for Keras 3 on JAX, whose variables TensorFlow's
    checkpoint cannot hold: the whole of every variable (train.sync.local_value: the leader's
    own copy, no collective; a model split across processes is checkpointed sharded instead),
    in their fixed order, in one .npz. `read` checks the count and shapes and keeps the
    values in `loaded` without assigning them: JAX assigns a variable that spans processes
    only in step with every process (it checks that they all assign the same value), and rank
    0 reads alone; every rank assigns them when rank 0 broadcasts them (train.sync). It also
    reads a sharded checkpoint whole, for a job resumed with a model no longer split across
    processes (another mesh or instance count)."""

    def __init__(self, variables: list):
        self.variables = variables
        self.loaded: list[np.ndarray] | None = None

    def write(self, prefix: str) -> None:
        from train.sync import local_value

        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
        # np.savez's file, written one variable at a time: np.savez takes every array at once,
        # so the whole model and its optimizer's moments were held whole besides the
        # variables themselves (measured: +93 MiB over the training peak for 15.8M
        # parameters, docs/model-parallel.md)
        with zipfile.ZipFile(f"{prefix}.npz", "w", allowZip64=True) as archive:
            for index, variable in enumerate(self.variables):
                with archive.open(f"arr_{index}.npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, np.asarray(local_value(variable)))

    def read(self, prefix: str) -> ArrayCheckpoint:
        folder = Path(prefix).parent
        if is_sharded(folder):
            self.loaded = read_whole(folder, variable_specs(self.variables))
            return self
        with np.load(f"{prefix}.npz") as arrays:
            values = [arrays[f"arr_{index}"] for index in range(len(arrays.files))]
        shapes = [tuple(v.shape) for v in self.variables]
        if [value.shape for value in values] != shapes:
            raise ValueError(
                f"it holds {len(values)} arrays that do not match the model's and "
                f"optimizer's {len(shapes)} variables"
            )
        self.loaded = values
        return self

    def assert_existing_objects_matched(self) -> ArrayCheckpoint:
        return self  # read checked them


def loaded_values(checkpoint: tf.train.Checkpoint | ArrayCheckpoint) -> list | None:
    """The values a checkpoint read but did not assign (ArrayCheckpoint), else None."""
    return checkpoint.loaded if isinstance(checkpoint, ArrayCheckpoint) else None


def variables_checkpoint(model, optimizer, arrays: bool) -> tf.train.Checkpoint | ArrayCheckpoint:
    """What a checkpoint holds: the model's and its optimizer's variables; as arrays for Keras
    3 on JAX (`arrays`), whose variables TensorFlow's Checkpoint cannot track."""
    if arrays:
        return ArrayCheckpoint(model.variables + optimizer.variables)
    return tf.train.Checkpoint(model=model, optimizer=optimizer)


def split_across_processes(variables: Sequence) -> bool:
    """Whether some variable spans other processes' devices, so that no process can read the
    model alone and its checkpoints must be sharded (the same answer on every process, from
    the shardings they share; False for anything but Keras 3 on JAX)."""
    from train.jax_arrays import spans_processes

    return any(spans_processes(getattr(v, "value", None)) for v in variables)


Found = tuple[Path, dict[str, Any]]  # a checkpoint folder and its state


class LeaderCheckpoints:
    """The leader's whole checkpoint (tf.train.Checkpoint, or ArrayCheckpoint on JAX) in the
    store; every rank calls `save` and `resume` (a stack whose variables every rank must read
    together, Sync.saves_on_every_rank, has the others write a copy that is thrown away)."""

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint | ArrayCheckpoint,
        store: CheckpointStore,
        sync: Sync,
        variables: list,
    ):
        self.checkpoint, self.store, self.sync, self.variables = checkpoint, store, sync, variables

    def save(self, epochs_done: int, **state: Any) -> Path | None:
        """The checkpoint of `epochs_done` epochs and `state`; its folder on the leader."""
        if self.sync.rank == 0:
            return self.store.save(self.checkpoint, epochs_done, **state)
        if self.sync.saves_on_every_rank:
            scratch_write(self.checkpoint)
        return None

    def resume(self, log: Callable[[str], None]) -> Found | None:
        """The leader restores the newest checkpoint that reads back; every rank gets its
        (folder, state), or None, and starts from the leader's variables."""
        found = None
        if self.sync.rank == 0:
            self.store.clean_torn()
            found = self.store.resume(self.checkpoint, log)
        found = self.sync.broadcast_object(found, name="resumed")
        self.sync.broadcast_variables(self.variables, loaded_values(self.checkpoint))
        return found


def scratch_write(checkpoint: tf.train.Checkpoint | ArrayCheckpoint) -> None:
    """A worker's part in a save every rank must join, written and thrown away."""
    folder = Path(tempfile.mkdtemp(prefix="checkpoint-"))
    try:
        checkpoint.write(str(folder / "ckpt"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class ShardedCheckpoints:
    """Checkpoints of a model split across processes (train.sharded_checkpoint) in the store's
    folder of every host; every process calls `save` and `resume` with the same variables.

    A save: the leader names the folder (`epoch-NNNNNN[.K]`) and sends the name; every
    process writes its own shards into its own host's copy of it; every process reports
    whether it wrote them, and only when all did does the leader write `state.json` (aside
    and renamed), so a folder counts only once every process confirmed; a failed write names
    its rank. The leader then prunes all but the `keep` newest, and every host removes its
    own copies of those folders.

    A resume: first every host gets the shard files of the leader's complete folders that
    only other hosts hold (after a restart inside the job; after a new start S3 restored them
    all everywhere); then the leader picks the newest folder whose shards are all there, or a
    whole checkpoint of a job not split across processes, logging each one it skips; every
    process reads its own pieces of it in its current sharding (another mesh or process count
    reshards), or assigns the leader's whole values."""

    def __init__(self, store: CheckpointStore, mpi: OverMpi, variables: list):
        self.store, self.mpi, self.variables = store, mpi, variables

    def save(self, epochs_done: int, **state: Any) -> Path | None:
        """The checkpoint of `epochs_done` epochs and `state`; its folder on the leader."""
        from train.sharded_checkpoint import save_variables

        leader = self.mpi.rank == 0
        folder = self.mpi.broadcast_object(
            self.store.next_folder(epochs_done) if leader else None, name="checkpoint folder"
        )
        try:
            save_variables(folder, self.variables)
            problem = None
        except Exception as error:  # every process must reach the agreement below
            problem = f"{type(error).__name__}: {error}"
        problems = self.mpi.allgather_object(problem, name="checkpoint written")
        failed = [(rank, problem) for rank, problem in enumerate(problems) if problem]
        if failed:
            rank, problem = failed[0]
            raise RuntimeError(
                f"checkpoint {folder} not saved: rank {rank} could not write its shards "
                f"({problem}); the job resumes from the checkpoint before it"
            )
        pruned = None
        if leader:
            self.store.confirm(folder, epochs_done, **state)
            pruned = self.store.prune()
        for name in self.mpi.broadcast_object(pruned, name="checkpoints pruned"):
            shutil.rmtree(self.store.directory / name, ignore_errors=True)
        return folder if leader else None

    def resume(self, log: Callable[[str], None]) -> Found | None:
        """The newest usable checkpoint's (folder, state) on every process, its values in
        every process's variables; None (nothing assigned) when there is none.
        IncompleteCheckpoint (exit code 2) where a process cannot read its pieces."""
        from train.sharded_checkpoint import read_manifest, restore_variables, share_files

        leader, directory = self.mpi.rank == 0, self.store.directory
        if leader:
            self.store.clean_torn()
        names = self.mpi.broadcast_object(
            [folder.name for folder in complete(directory)] if leader else None,
            name="checkpoints",
        )
        for name in names:
            received = share_files(directory / name, self.mpi.comm)
            if received and leader:  # the others' copies as the leader's: one line
                log(
                    f"copied {len(received)} shard file(s) of {name} that only other hosts "
                    "held (a restart before SageMaker's S3 sync merged the hosts' folders)"
                )
        whole = ArrayCheckpoint(self.variables)  # a checkpoint of a job not split across hosts

        def readable(folder: Path) -> None:
            if is_sharded(folder):
                read_manifest(folder).close()
            else:
                CheckpointStore.restore(whole, folder)

        found = newest_usable(directory, readable, log) if leader else None
        # which kind it is, as the leader sees it: another host's copy may hold stray files
        found, sharded = self.mpi.broadcast_object(
            (found, found is not None and is_sharded(found[0])), name="resumed"
        )
        if sharded:
            restore_variables(found[0], self.variables)
        elif found is not None:
            self.mpi.broadcast_variables(self.variables, whole.loaded)
        return found


def checkpoints_for(
    model: Any, optimizer: Any, store: CheckpointStore, sync: Any, arrays: bool
) -> LeaderCheckpoints | ShardedCheckpoints:
    """The built-in trainer's checkpoints of `model` and its built `optimizer`: sharded when
    the model is split across processes (on Keras 3 / JAX, whose Sync is over MPI), else the
    leader's whole one (`arrays` on Keras 3 / JAX)."""
    variables = list(model.variables) + list(optimizer.variables)
    if split_across_processes(variables):
        return ShardedCheckpoints(store, sync, variables)  # KerasOnJax: a Sync over MPI
    return LeaderCheckpoints(
        variables_checkpoint(model, optimizer, arrays=arrays), store, sync, variables
    )
