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
  global array would be a collective every process must join).
Only the Horovod class imports Horovod: the TensorFlow 2.21 image has none.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import numpy as np
import tensorflow as tf
from mpi4py import MPI

from job.trainer_config import JAX

Gradients = list


class Horovod:
    name = "Horovod"
    saves_on_every_rank = False
    optimizer_accumulates = False  # train.accumulation's one step of k micro-batches

    def __init__(self, fp16_allreduce: bool):
        from train.runtime import start_horovod

        start_horovod()
        import horovod.tensorflow as hvd

        self.hvd, self.fp16_allreduce = hvd, fp16_allreduce
        self.compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
        self.rank, self.size = hvd.rank(), hvd.size()

    def scope(self) -> ContextManager:
        return contextlib.nullcontext()

    def allgather_object(self, value: Any, name: str) -> list:
        return self.hvd.allgather_object(value, name=name)

    def broadcast_object(self, value: Any, name: str) -> Any:
        return self.hvd.broadcast_object(value, root_rank=0, name=name)

    def broadcast_variables(self, variables: list[tf.Variable], loaded=None) -> None:
        self.hvd.broadcast_variables(variables, root_rank=0)  # restored in place: no `loaded`

    def average_statistics(self, variables: list[tf.Variable]) -> None:
        for variable in variables:
            if variable.dtype.is_floating:
                variable.assign(self.hvd.allreduce(variable, op=self.hvd.Average,
                                                   name=f"statistics.{variable.name}"))

    def optimizer(self, inner: tf.keras.optimizers.Optimizer) -> tf.keras.optimizers.Optimizer:
        """Per-gradient allreduces that start while backpropagation is still running (2 ranks:
        10% faster than one grouped allreduce after it)."""
        from train.distributed import optimizer

        return optimizer(inner, fp16_allreduce=self.fp16_allreduce)

    def gradient_mean(self) -> Callable[[Gradients], Gradients]:
        """The mean over ranks of one step's summed micro-batch gradients, in one allreduce."""
        hvd, compression = self.hvd, self.compression
        if self.size == 1:
            return lambda gradients: gradients
        return lambda gradients: hvd.grouped_allreduce(gradients, op=hvd.Average,
                                                        compression=compression)

    def callbacks(self) -> list[tf.keras.callbacks.Callback]:
        import horovod.tensorflow.keras as hvd_keras

        return [hvd_keras.callbacks.MetricAverageCallback()]  # average epoch metrics

    def distribute(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset

    def evaluation(self, dataset: tf.data.Dataset, samples: int, batch: int
                   ) -> tuple[tf.data.Dataset, int | None]:
        """(validation data, steps): each rank its whole share, however many batches."""
        return dataset, None

    def plain(self, model: tf.keras.Model, builder: Callable[[], tf.keras.Model]
              ) -> tf.keras.Model:
        return model


class OverMpi:
    """Objects and rank 0's variable values travel over MPI (the stacks without Horovod)."""

    def __init__(self):
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def allgather_object(self, value: Any, name: str) -> list:
        return self.comm.allgather(value)

    def broadcast_object(self, value: Any, name: str) -> Any:
        return self.comm.bcast(value, root=0)

    def broadcast_variables(self, variables: list, loaded: list | None = None) -> None:
        """Rank 0's own copy of every variable, or the values it `loaded` from a checkpoint
        for them, to every worker's every replica (a plain read of a worker-averaged or
        process-spanning variable would mix in or wait for the others)."""
        if self.rank == 0 and loaded is None:
            loaded = [local_value(v) for v in variables]
        values = self.comm.bcast(loaded if self.rank == 0 else None, root=0)
        for variable, value in zip(variables, values):
            variable.assign(value)

    def uniform_evaluation(self, dataset: tf.data.Dataset, samples: int, batch: int
                           ) -> tuple[tf.data.Dataset, int]:
        """(validation data, steps): every worker must run the same number of steps, so a
        worker whose share has fewer batches than the largest share's goes round its own share
        again for the difference (shares differ by a file at most; these few samples count
        twice in the validation metrics)."""
        steps = max(-(-count // batch) for count in self.comm.allgather(samples))
        return dataset.repeat().take(steps), steps


class Mirrored(OverMpi):
    name = "MultiWorkerMirroredStrategy"
    saves_on_every_rank = True
    optimizer_accumulates = False

    def __init__(self, local_size: int):
        from train.runtime import share_cores

        share_cores(local_size)
        # TF_CONFIG is already set (train.rank_main, from the launcher's plan).
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        super().__init__()

    def scope(self) -> ContextManager:
        return self.strategy.scope()

    def average_statistics(self, variables: list[tf.Variable]) -> None:
        """Nothing to do: MWMS keeps them per worker and averages them on every read."""

    def optimizer(self, inner: tf.keras.optimizers.Optimizer) -> tf.keras.optimizers.Optimizer:
        return inner  # its apply_gradients sums over the replicas

    def gradient_mean(self) -> Callable[[Gradients], Gradients]:
        return lambda gradients: gradients  # apply_gradients sums a loss already divided

    def callbacks(self) -> list[tf.keras.callbacks.Callback]:
        return []  # metrics are averaged over the workers when Keras reads them

    def distribute(self, dataset: tf.data.Dataset) -> tf.distribute.DistributedDataset:
        """This worker's own batches, as they are: the trainer shards the data itself, so
        TensorFlow must neither shard nor re-batch it."""
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.OFF
        dataset = dataset.with_options(options)
        return self.strategy.distribute_datasets_from_function(lambda _: dataset)

    def evaluation(self, dataset: tf.data.Dataset, samples: int, batch: int
                   ) -> tuple[tf.distribute.DistributedDataset, int]:
        repeated, steps = self.uniform_evaluation(dataset, samples, batch)
        return self.distribute(repeated), steps

    def plain(self, model: tf.keras.Model, builder: Callable[[], tf.keras.Model]
              ) -> tf.keras.Model:
        """The trained model outside the strategy (for the export every worker joins): a new
        model from `builder` with the averaged weights, read by every worker together."""
        weights = model.get_weights()
        copy = builder()
        copy.set_weights(weights)
        return copy


class KerasOnJax(OverMpi):
    name = "Keras 3 on JAX (keras.distribution)"
    saves_on_every_rank = False
    optimizer_accumulates = True  # Keras 3's gradient_accumulation_steps, batch by batch

    def __init__(self):
        import keras

        keras.distribution.initialize()  # every process of the job, from the launcher's plan
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(auto_shard_dataset=False))
        super().__init__()

    def scope(self) -> ContextManager:
        return contextlib.nullcontext()

    def average_statistics(self, variables: list) -> None:
        """Nothing to do: batch statistics are computed over the global batch."""

    def optimizer(self, inner):
        return inner

    def callbacks(self) -> list:
        return []  # metrics are computed over the global batch

    def distribute(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset  # this process's share; Keras assembles the global batch

    def evaluation(self, dataset: tf.data.Dataset, samples: int, batch: int
                   ) -> tuple[tf.data.Dataset, int]:
        """As MWMS's, in whole batches: every process's part of a step has the same shape."""
        whole = dataset.unbatch().repeat().batch(batch, drop_remainder=True)
        return self.uniform_evaluation(whole, samples, batch)

    def plain(self, model, builder: Callable):
        """The trained model outside the distribution (for rank 0's export alone): a new
        model from `builder` with this process's copy of the weights."""
        import keras

        weights = [local_value(weight) for weight in model.weights]
        keras.distribution.set_distribution(None)
        copy = builder()
        copy.set_weights(weights)
        return copy


def local_value(variable) -> np.ndarray:
    """This process's own copy of a variable, without a read across workers or processes:
    MWMS's first replica, a JAX array's first local shard (Keras 3), or the variable."""
    value = getattr(variable, "values", (variable,))[0]
    array = getattr(value, "value", value)  # a Keras 3 variable's JAX array
    if hasattr(array, "addressable_data"):
        return np.asarray(array.addressable_data(0))
    return value.numpy()


Sync = Horovod | Mirrored | KerasOnJax


def synchronise(backend: str, tf_workers: tuple[str, ...], local_size: int,
                fp16_allreduce: bool) -> Sync:
    if backend == JAX:
        return KerasOnJax()
    return Mirrored(local_size) if tf_workers else Horovod(fp16_allreduce)
