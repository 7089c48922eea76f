"""How the built-in trainer's ranks synchronise: Horovod, or TensorFlow's own
MultiWorkerMirroredStrategy (MWMS). The trainer says what it needs; each class does it its way.

Both stacks start their ranks with mpirun (container.plan), so small Python objects (counts,
class lists, the resume position, weight digests) travel over MPI on either; what differs is
the tensors:
- Horovod averages gradients with its DistributedOptimizer (or one grouped allreduce when
  micro-batches accumulate), broadcasts rank 0's variables, and averages epoch metrics and
  batch-normalisation statistics with allreduces;
- MWMS mirrors every variable on every worker: its optimizer sums the replicas' gradients of a
  loss Keras already divided by the replica count, its metrics and batch-normalisation
  statistics are averaged over the workers whenever they are read, and every worker must take
  part in each read of them, so every worker saves checkpoints and the model (only the chief's
  copy is kept). Keras 3 cannot train under MWMS (FACTS: PerReplica conversion error), so this
  runs on tf_keras: the launcher sets TF_USE_LEGACY_KERAS=1 for these ranks;
- Keras 3 on JAX (backend=jax) shards every step's global batch over every process's devices
  (keras.distribution.DataParallel): gradients, metrics and batch-normalisation statistics are
  computed over the global batch by JAX's collectives, so every variable stays replicated and
  nothing is averaged by hand; each process feeds its own share of the data
  (auto_shard_dataset off), and reads of a variable take this process's copy (a read of the
  global array would be a collective every process must join). With `model_parallel` M > 1
  the devices form a data x model mesh (job.mesh): Keras's ModelParallel splits each kernel
  and embedding over the model axis (the model's own get_layout_map decides first, where it
  has one; train.layouts.auto_model_parallel the rest), the batch over the data axis; the
  processes a model axis spans read the same input (`data_group`), and a read of a variable
  split over several processes' devices is a collective every process joins
  (train.jax_arrays), so every process takes part in the export; its checkpoints are sharded,
  each process writing its own pieces (train.checkpoints.ShardedCheckpoints).
Only the Horovod class imports Horovod: the TensorFlow 2.21 image has none.

`Sync` is the contract, in one place: every method the trainer calls, each saying what it must
do. A stack is a subclass that implements all of them (a type checker, and Python when the class
is instantiated, name a missing one), so another stack is one more class and one more branch in
`synchronise`, not conditions in the trainer; a mesh of data x model is KerasOnJax's
`model_parallel` (its distribution and `data_group`), not a fourth copy.
"""

from __future__ import annotations

import contextlib
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf
from mpi4py import MPI

from job.errors import ConfigError
from job.mesh import Mesh
from job.trainer_config import JAX
from train import activity, jax_arrays, jax_heartbeat
from train.jax_arrays import agree_fits, local_whole, nbytes, whole_value
from train.layouts import auto_model_parallel
from train.logs import log

# The Keras classes of whichever Keras train.framework picked: tf.keras's (Horovod, MWMS) or
# Keras 3's (JAX); two class trees that no single annotation names.
Model = Any
Optimizer = Any
Variable = Any
Callback = Any
Gradients = list[Any]
# Builds the trainer's optimizer; a stack passes the keyword arguments it needs (Keras 3's
# gradient_accumulation_steps).
OptimizerFactory = Callable[..., Optimizer]


class Sync(ABC):
    """What the built-in trainer (train.trainer) asks of the stack its ranks synchronise with,
    all of it: a new stack is a new subclass, never an `if` in the trainer. Each method says
    what it must do; how is the subclass's. Every rank calls every method in the same order
    (most are collectives), so none may skip a call on some ranks only."""

    name: ClassVar[str]  # for the log: "2 rank(s) ...; TensorFlow 2.15.1, Horovod"
    # Whether every rank must take part in writing a checkpoint (only rank 0's copy is kept).
    saves_on_every_rank: bool
    rank: int  # this process's rank, 0 to size - 1; rank 0 is the leader
    size: int  # ranks in the job
    # Ranks that read the same input (a model split across them): rank r reads share
    # r // data_group of size // data_group. 1 on every stack but a model axis across processes.
    data_group: int = 1

    @abstractmethod
    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """Where the model and its optimizer are built and compiled."""

    @abstractmethod
    def allgather_object(self, value: Any, name: str) -> list[Any]:
        """Every rank's `value` (picklable), in rank order, on every rank."""

    @abstractmethod
    def broadcast_object(self, value: Any, name: str) -> Any:
        """Rank 0's `value` on every rank."""

    @abstractmethod
    def broadcast_variables(
        self, variables: list[Variable], loaded: list[np.ndarray] | None = None
    ) -> None:
        """Rank 0's values of `variables` assigned on every rank: the values rank 0 `loaded`
        from a checkpoint for them (train.checkpoints.loaded_values), else its own."""

    @abstractmethod
    def average_statistics(self, variables: list[Variable]) -> None:
        """Batch normalisation's moving statistics, which no gradient trains, made the same
        on every rank (their mean), before a checkpoint or the export."""

    @abstractmethod
    def step(
        self, model: Model, optimizer: OptimizerFactory, accumulation_steps: int
    ) -> tuple[Model, Optimizer]:
        """(what `fit` runs, its optimizer, built with `optimizer`) for optimizer steps of
        `accumulation_steps` micro-batches whose gradients are averaged over the micro-batches
        and over the ranks: what gets checkpointed and exported stays `model`."""

    @abstractmethod
    def batches_per_step(self, accumulation_steps: int) -> int:
        """Batches of `fit` per optimizer step, for `step`'s stepper: 1 where one batch holds
        all `accumulation_steps` micro-batches, else `accumulation_steps`."""

    @abstractmethod
    def callbacks(self) -> list[Callback]:
        """The stack's Keras callbacks for `fit` (the epoch metrics the same on every rank)."""

    @abstractmethod
    def distribute(self, dataset: tf.data.Dataset) -> Any:
        """This rank's training batches as `fit` takes them (each rank reads its own share)."""

    @abstractmethod
    def evaluation(
        self, dataset: tf.data.Dataset, samples: int, batch: int
    ) -> tuple[Any, int | None]:
        """(validation data as `fit` takes it, validation steps or None for all of it) from
        this rank's `samples` validation samples in batches of `batch`."""

    @abstractmethod
    def plain(self, model: Model, builder: Callable[[], Model]) -> Model:
        """The trained `model` as the export writes it, outside the stack (`builder` makes a
        new, untrained one). Every rank calls it; only rank 0 exports."""


def accumulated_step(
    model: Model,
    optimizer: OptimizerFactory,
    accumulation_steps: int,
    synchronising: Callable[[Optimizer], Optimizer],
    mean_over_ranks: Callable[[], Callable[[Gradients], Gradients]],
) -> tuple[Model, Optimizer]:
    """`Sync.step` on TensorFlow: one micro-batch per step is Keras' own step with the
    `synchronising` optimizer; k are train.accumulation's one step of k micro-batches (one
    batch of `fit`) with one mean over ranks, from `mean_over_ranks()`, and the plain optimizer.
    """
    from train.accumulation import AccumulatingModel  # a tf.keras class: only when it runs

    inner = optimizer()
    if accumulation_steps == 1:
        return model, synchronising(inner)
    return AccumulatingModel(model, accumulation_steps, mean_over_ranks()), inner


class Horovod(Sync):
    name = "Horovod"
    saves_on_every_rank = False

    def __init__(self, fp16_allreduce: bool) -> None:
        from train.runtime import start_horovod

        start_horovod()
        import horovod.tensorflow as hvd

        self.hvd: Any = hvd
        self.fp16_allreduce = fp16_allreduce
        self.compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
        self.rank, self.size = hvd.rank(), hvd.size()

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def allgather_object(self, value: Any, name: str) -> list[Any]:
        gathered: list[Any] = self.hvd.allgather_object(value, name=name)
        return gathered

    def broadcast_object(self, value: Any, name: str) -> Any:
        return self.hvd.broadcast_object(value, root_rank=0, name=name)

    def broadcast_variables(
        self, variables: list[Variable], loaded: list[np.ndarray] | None = None
    ) -> None:
        self.hvd.broadcast_variables(variables, root_rank=0)  # restored in place: no `loaded`

    def average_statistics(self, variables: list[Variable]) -> None:
        for variable in variables:
            if variable.dtype.is_floating:
                variable.assign(
                    self.hvd.allreduce(
                        variable, op=self.hvd.Average, name=f"statistics.{variable.name}"
                    )
                )

    def step(
        self, model: Model, optimizer: OptimizerFactory, accumulation_steps: int
    ) -> tuple[Model, Optimizer]:
        """AccumulatingModel for k micro-batches: with Horovod 1.2x faster than its
        backward_passes_per_step (see train.accumulation)."""
        return accumulated_step(
            model, optimizer, accumulation_steps, self.optimizer, self.gradient_mean
        )

    def batches_per_step(self, accumulation_steps: int) -> int:
        return 1

    def optimizer(self, inner: Optimizer) -> Optimizer:
        """Per-gradient allreduces that start while backpropagation is still running (2 ranks:
        10% faster than one grouped allreduce after it)."""
        from train.distributed import optimizer

        return optimizer(inner, fp16_allreduce=self.fp16_allreduce)

    def gradient_mean(self) -> Callable[[Gradients], Gradients]:
        """The mean over ranks of one step's summed micro-batch gradients, in one allreduce."""
        hvd, compression = self.hvd, self.compression
        if self.size == 1:
            return lambda gradients: gradients
        return lambda gradients: hvd.grouped_allreduce(
            gradients, op=hvd.Average, compression=compression
        )

    def callbacks(self) -> list[Callback]:
        import horovod.tensorflow.keras as hvd_keras

        return [hvd_keras.callbacks.MetricAverageCallback()]  # average epoch metrics

    def distribute(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset

    def evaluation(
        self, dataset: tf.data.Dataset, samples: int, batch: int
    ) -> tuple[tf.data.Dataset, int | None]:
        """(validation data, steps): each rank its whole share, however many batches."""
        return dataset, None

    def plain(self, model: Model, builder: Callable[[], Model]) -> Model:
        return model


class OverMpi:
    """Objects and rank 0's variable values travel over MPI (the stacks without Horovod)."""

    def __init__(self) -> None:
        self.comm = MPI.COMM_WORLD
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()

    def allgather_object(self, value: Any, name: str) -> list[Any]:
        gathered: list[Any] = self.comm.allgather(value)
        return gathered

    def broadcast_object(self, value: Any, name: str) -> Any:
        return self.comm.bcast(value, root=0)

    def broadcast_variables(
        self, variables: list[Variable], loaded: list[np.ndarray] | None = None
    ) -> None:
        """Rank 0's own copy of every variable, or the values it `loaded` from a checkpoint
        for them, to every worker's every replica (a plain read of a worker-averaged or
        process-spanning variable would mix in or wait for the others)."""
        if self.rank == 0 and loaded is None:
            loaded = [local_value(v) for v in variables]
        values = self.comm.bcast(loaded if self.rank == 0 else None, root=0)
        for variable, value in zip(variables, values):
            variable.assign(value)

    def uniform_evaluation(
        self, dataset: tf.data.Dataset, samples: int, batch: int
    ) -> tuple[tf.data.Dataset, int]:
        """(validation data, steps): every worker must run the same number of steps, so a
        worker whose share has fewer batches than the largest share's goes round its own share
        again for the difference (shares differ by a file at most; these few samples count
        twice in the validation metrics)."""
        steps = max(-(-count // batch) for count in self.comm.allgather(samples))
        return dataset.repeat().take(steps), steps


class Mirrored(OverMpi, Sync):
    name = "MultiWorkerMirroredStrategy"
    saves_on_every_rank = True

    def __init__(self, local_size: int) -> None:
        from train.runtime import share_cores

        share_cores(local_size)
        # TF_CONFIG is already set (train.rank_main, from the launcher's plan).
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        super().__init__()

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        scope: contextlib.AbstractContextManager[Any] = self.strategy.scope()
        return scope

    def average_statistics(self, variables: list[Variable]) -> None:
        """Nothing to do: MWMS keeps them per worker and averages them on every read."""

    def step(
        self, model: Model, optimizer: OptimizerFactory, accumulation_steps: int
    ) -> tuple[Model, Optimizer]:
        """The optimizer as it is (its apply_gradients sums over the replicas the gradients of
        a loss Keras already divided by their count), and no mean over ranks by hand."""
        return accumulated_step(
            model,
            optimizer,
            accumulation_steps,
            lambda inner: inner,
            lambda: lambda gradients: gradients,
        )

    def batches_per_step(self, accumulation_steps: int) -> int:
        return 1

    def callbacks(self) -> list[Callback]:
        return []  # metrics are averaged over the workers when Keras reads them

    def distribute(self, dataset: tf.data.Dataset) -> tf.distribute.DistributedDataset:
        """This worker's own batches, as they are: the trainer shards the data itself, so
        TensorFlow must neither shard nor re-batch it."""
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = dataset.with_options(options)
        return self.strategy.distribute_datasets_from_function(lambda _: dataset)

    def evaluation(
        self, dataset: tf.data.Dataset, samples: int, batch: int
    ) -> tuple[tf.distribute.DistributedDataset, int]:
        repeated, steps = self.uniform_evaluation(dataset, samples, batch)
        return self.distribute(repeated), steps

    def plain(self, model: Model, builder: Callable[[], Model]) -> Model:
        """The trained model outside the strategy (for the export every worker joins): a new
        model from `builder` with the averaged weights, read by every worker together."""
        weights = model.get_weights()
        copy = builder()
        copy.set_weights(weights)
        return copy


class KerasOnJax(OverMpi, Sync):
    name = "Keras 3 on JAX (keras.distribution)"
    saves_on_every_rank = False

    def __init__(
        self, model_parallel: int = 1, layout_map_of: Callable[[Any], Any] | None = None
    ) -> None:
        """`model_parallel`: the mesh's model axis (1: data parallelism); `layout_map_of`: the
        model's own `get_layout_map(mesh)`, if it has one."""
        import jax
        import keras

        # JAX's heartbeat longer than the watchdog's, and its runtime's timer threads out of the
        # pulse, so that the watchdog names a frozen process (as keras_script does for scripts)
        jax_heartbeat.lengthen(jax, lambda text: log.info(f"trainer: {text}"))
        activity.exclude_jax_threads(jax)
        keras.distribution.initialize()  # every process of the job, from the launcher's plan
        self.mesh = Mesh(jax.process_count(), jax.local_device_count(), model_parallel)
        problem = self.mesh.problem()
        if problem:
            raise ConfigError(f"{problem} (JAX found {jax.local_device_count()} per process)")
        self.layout_map_of = layout_map_of
        self.data_group = self.mesh.group
        keras.distribution.set_distribution(self.distribution())
        super().__init__()

    def distribution(self) -> Any:
        """How Keras lays every step over the job's devices (after `initialize`, which finds
        them): the global batch sharded over every process's devices, every variable
        replicated; with a model axis, the data x model mesh in JAX's device order (a model
        axis no larger than a process's devices stays inside it), each kernel and embedding
        split over the model axis and the batch over the data axis."""
        import keras

        if self.mesh.model_parallel == 1:
            return keras.distribution.DataParallel(auto_shard_dataset=False)
        mesh = keras.distribution.DeviceMesh(
            (self.mesh.replicas, self.mesh.model_parallel),
            [BATCH_AXIS, MODEL_AXIS],
            keras.distribution.list_devices(),
        )
        return auto_model_parallel(
            mesh,
            model_dim_name=MODEL_AXIS,
            layout_map=self.layout_map_of(mesh) if self.layout_map_of else None,
            batch_dim_name=BATCH_AXIS,
            auto_shard_dataset=False,
        )

    def broadcast_variables(
        self, variables: list[Variable], loaded: list[np.ndarray] | None = None
    ) -> None:
        """With a model axis every variable is one array over the whole mesh, which every
        process built alike from the seed `keras.distribution.initialize` agreed (JAX checks
        it): only values `loaded` from a checkpoint travel, whole, and every process assigns
        them (each keeps its own pieces)."""
        if self.mesh.model_parallel == 1:
            super().broadcast_variables(variables, loaded)
            return
        values = self.comm.bcast(loaded if self.rank == 0 else None, root=0)
        for variable, value in zip(variables, values or ()):
            variable.assign(value)

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def average_statistics(self, variables: list[Variable]) -> None:
        """Nothing to do: batch statistics are computed over the global batch."""

    def step(
        self, model: Model, optimizer: OptimizerFactory, accumulation_steps: int
    ) -> tuple[Model, Optimizer]:
        """Keras' own step and its optimizer's own accumulation: each micro-batch a batch of
        `fit`, an update every k (gradient_accumulation_steps); JAX's collectives average
        over the global batch."""
        accumulate = (
            {"gradient_accumulation_steps": accumulation_steps} if accumulation_steps > 1 else {}
        )
        return model, optimizer(**accumulate)

    def batches_per_step(self, accumulation_steps: int) -> int:
        return accumulation_steps

    def callbacks(self) -> list[Callback]:
        return []  # metrics are computed over the global batch

    def distribute(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset  # this process's share; Keras assembles the global batch

    def evaluation(
        self, dataset: tf.data.Dataset, samples: int, batch: int
    ) -> tuple[tf.data.Dataset, int]:
        """As MWMS's, in whole batches: every process's part of a step has the same shape."""
        whole = dataset.unbatch().repeat().batch(batch, drop_remainder=True)
        return self.uniform_evaluation(whole, samples, batch)

    def plain(self, model: Model, builder: Callable[[], Model]) -> Model:
        """The trained model outside the distribution (for rank 0's export alone): a new
        model from `builder` with the whole weights (with a model axis across processes
        gathered by every process, once each host agreed that they fit its memory), read
        and assigned one weight at a time: never a second whole model besides the copy."""
        import jax
        import keras

        if self.mesh.group > 1:  # a model axis across processes
            agree_fits(
                "the export",
                "the model's weights",
                sum(nbytes(weight) for weight in model.weights),
                EXPORT_INSTEAD,
            )
        keras.distribution.set_distribution(None)
        copy = builder()
        # JAX computes the copy's random initial values asynchronously, with temporaries of
        # about 4 times its weights (measured): done before any whole weight is read, so
        # that they do not add to the gather and the save
        jax.block_until_ready([target.value for target in copy.weights])
        for weight, target in zip(model.weights, copy.weights, strict=True):
            target.assign(gathered_value(weight))
        return copy


# What a job whose model cannot be gathered onto one host does instead.
EXPORT_INSTEAD = (
    "The checkpoints in the checkpoint folder hold the trained model; give each host more "
    "memory (a larger instance type) to export it whole"
)
BATCH_AXIS, MODEL_AXIS = "batch", "model"  # the mesh's axes (train.layouts shards "model")


def local_value(variable: Variable) -> np.ndarray:
    """This process's own copy of a variable, without a read across workers or processes:
    MWMS's first replica, a Keras 3 variable whole from this process's devices' pieces
    (RuntimeError where it is split over other processes' devices too: see
    `gathered_value`), or the variable."""
    value = getattr(variable, "values", (variable,))[0]
    array = getattr(value, "value", value)  # a Keras 3 variable's JAX array
    if hasattr(array, "addressable_data"):  # a method: hasattr computes no shards
        return local_whole(array)
    return value.numpy()


def gathered_value(variable: Variable) -> np.ndarray:
    """A variable's whole value: `local_value`, except that a Keras 3 variable split over
    several processes' devices is gathered, a collective every process joins in the same
    order (KerasOnJax.plain: the export)."""
    array = getattr(variable, "value", None)
    if hasattr(array, "addressable_data"):  # a Keras 3 variable's JAX array
        return whole_value(array)  # gathered only where it spans processes
    return local_value(variable)


def shard_digests(variables: list[Variable]) -> dict[tuple[int, Any], str]:
    """(variable index, piece) -> digest of each piece of `variables` this process holds (the
    whole of a variable held whole): ranks holding the same piece must agree on it."""
    digests: dict[tuple[int, Any], str] = {}
    pieces: dict[Any, str]  # by piece of the array, or "whole"
    for index, variable in enumerate(variables):
        array = getattr(variable, "value", None)
        if array is not None and hasattr(array, "addressable_data"):
            pieces = jax_arrays.shard_digests(array)
        else:
            data = np.ascontiguousarray(local_value(variable))
            pieces = {"whole": hashlib.sha256(data.tobytes()).hexdigest()}
        digests.update({(index, place): digest for place, digest in pieces.items()})
    return digests


def synchronise(
    backend: str,
    tf_workers: tuple[str, ...],
    local_size: int,
    fp16_allreduce: bool,
    model_parallel: int = 1,
    layout_map_of: Callable[[Any], Any] | None = None,
) -> Sync:
    """The stack the launcher planned: Keras 3 on JAX for backend=jax (over a data x model
    mesh with `model_parallel` > 1), else MWMS when it planned `tf_workers`, else Horovod."""
    if backend == JAX:
        return KerasOnJax(model_parallel, layout_map_of)
    return Mirrored(local_size) if tf_workers else Horovod(fp16_allreduce)
