"""Whether a script's processes trained one model together or one model each.

A job whose processes never synchronise ends like one whose processes do: every process
trains, saves, exits 0, and the job completes with one process's model, which the user takes
for the job's. Three ways a script does this, each seen on this image's stacks:

- Keras 3 on JAX without `keras.distribution.initialize()` (keras.io's guide wraps it in a
  try/except, so a failed start goes on alone), or a TensorFlow script whose `tf.keras` ran on
  JAX under a MultiWorkerMirroredStrategy that then reported every host's replicas;
- keras.io's "Multi-GPU distributed training with TensorFlow", whose one-host
  `tf.distribute.MirroredStrategy` spans one process's devices, run on several hosts (or a
  MultiWorkerMirroredStrategy given a TF_CONFIG of its own, of fewer workers);
- a script that uses no distribution at all.

After the script, `observe` asks each stack how far its synchronisation reached, from what the
stack itself keeps in the process (nothing is imported that the script did not import): JAX's
process count once JAX has computed; TensorFlow's usage gauges of its strategies (the strategy
object may be gone by then, the gauges are not); Horovod's size. `verdict` (pure) decides:
the first two are known to have trained apart, and the job fails with `TrainedApart` (a
configuration error, exit code 2) naming the fix; the third is said as a warning, since a
script may still have exchanged its results some way no stack here sees (its own MPI calls).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from job.errors import ConfigError


class TrainedApart(ConfigError):
    """The job's processes each trained a model of their own: the user's script must change."""


@dataclass(frozen=True)
class Joined:
    """How many processes each stack's synchronisation spanned when the script ended; None
    where the script did not use that stack."""

    jax: int | None = None  # processes of JAX, once it computed
    tf_workers: int | None = None  # workers of the last MultiWorkerMirroredStrategy built
    tf_strategy: str | None = None  # the kind of tf.distribute strategy built last
    horovod: int | None = None  # ranks of an initialised Horovod
    tensorflow: bool = False  # the script imported TensorFlow

    def spanned(self) -> int:
        """The most processes any stack synchronised."""
        return max(self.jax or 1, self.tf_workers or 1, self.horovod or 1)


@dataclass(frozen=True)
class Verdict:
    text: str
    fails: bool  # known to have trained apart; otherwise a warning


# What TensorFlow's usage gauge records for the one-host strategy (mirrored_strategy.py).
ONE_HOST_STRATEGY = "MirroredStrategy"
INITIALIZE = (
    "call keras.distribution.initialize() with no arguments before building the "
    "model (the launcher sets KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and "
    "_PROCESS_ID for every process), and do not hide its error"
)


def synchronise(mwms: bool) -> str:
    """How a TensorFlow script joins the others on this image (`mwms`: TF_CONFIG is set, the
    TensorFlow 2.21 image) or on the Horovod image."""
    return (
        "use tf.distribute.MultiWorkerMirroredStrategy(), for which TF_CONFIG is set in "
        "every process"
        if mwms
        else "synchronise with Horovod (horovod.tensorflow.keras, "
        "or `from train import distributed`)"
    ) + ", or train on one instance"


def verdict(world_size: int, joined: Joined, mwms: bool) -> Verdict | None:
    """What to say of a job of `world_size` processes whose script left `joined`; None when
    its processes trained together (or there was only one)."""
    if world_size <= 1:
        return None
    if joined.jax is not None and joined.jax < world_size:
        if (joined.tf_workers or 1) >= world_size:
            return Verdict(
                f"this job has {world_size} processes and the script's "
                f"MultiWorkerMirroredStrategy spans {joined.tf_workers} workers, but its Keras "
                f"ran on JAX with {joined.jax}: the strategy does not drive JAX, and each "
                "process trained its own model. Build the model with tf.keras as tf_keras "
                "(TF_USE_LEGACY_KERAS=1, the default) under the strategy, or drop the "
                "strategy and " + INITIALIZE,
                fails=True,
            )
        return Verdict(
            f"this job has {world_size} processes, but the script's JAX ran with "
            f"{joined.jax}: each process trained its own model. "
            + INITIALIZE[0].upper()
            + INITIALIZE[1:],
            fails=True,
        )
    if joined.spanned() >= world_size:
        return None
    if joined.tf_strategy == ONE_HOST_STRATEGY:
        return Verdict(
            f"this job has {world_size} processes, but the script's tf.distribute."
            "MirroredStrategy spans the devices of one process only: each process trained its "
            f"own model. To train one model across them, {synchronise(mwms)}",
            fails=True,
        )
    if joined.tf_workers:  # a MultiWorkerMirroredStrategy of fewer workers (its own TF_CONFIG)
        return Verdict(
            f"this job has {world_size} processes, but the script's MultiWorkerMirrored"
            f"Strategy spans {joined.tf_workers} of them: each group trained its own model. "
            "Leave TF_CONFIG as the launcher sets it"
            + ("" if mwms else ", on the TensorFlow 2.21 image"),
            fails=True,
        )
    if joined.tensorflow or joined.jax is not None:
        return Verdict(
            f"this job has {world_size} processes, but the script synchronised them with "
            "none of MultiWorkerMirroredStrategy, Horovod or keras.distribution: unless it "
            "exchanged its results some other way, each process trained its own model and the "
            f"model is one process's. To train one model across them, {synchronise(mwms)}",
            fails=False,
        )
    return None


def observe() -> Joined:
    """How far each stack the script used reached, read from the stacks themselves."""
    tensorflow = "tensorflow" in sys.modules
    strategy, workers = _tensorflow_gauges() if tensorflow else (None, None)
    return Joined(
        jax=_jax_processes(),
        tf_workers=workers,
        tf_strategy=strategy,
        horovod=_horovod_size(),
        tensorflow=tensorflow,
    )


def _jax_processes() -> int | None:
    """JAX's process count, once the script computed with JAX (asking earlier would start a
    backend the script never used)."""
    if "jax" not in sys.modules:
        return None
    import jax

    try:  # private, so defensively: without it, JAX being imported is taken as used
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:
        backends_are_initialized = None
    if backends_are_initialized is not None and not backends_are_initialized():
        return None
    return jax.process_count()


def _tensorflow_gauges() -> tuple[str | None, int | None]:
    """(the kind of tf.distribute strategy built last, the workers of the last
    MultiWorkerMirroredStrategy), from TensorFlow's usage gauges (distribute_lib.py); (None,
    None) for what TensorFlow did not record."""
    try:
        from tensorflow.python.distribute import distribute_lib

        strategy = distribute_lib.distribution_strategy_gauge.get_cell("V2").value()
        workers = distribute_lib.distribution_strategy_replica_gauge.get_cell("num_workers").value()
    except (ImportError, AttributeError):
        return None, None
    return strategy or None, workers or None


def _horovod_size() -> int | None:
    """Horovod's ranks while it is initialised (a script that shut it down is not seen: only
    the warning, or a MirroredStrategy beside it, would then speak wrongly)."""
    horovod = sys.modules.get("horovod.tensorflow")
    try:
        return horovod.size() if horovod and horovod.is_initialized() else None
    except (AttributeError, ValueError):
        return None
