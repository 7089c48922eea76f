"""Rank start-up shared by the built-in trainer and the helper API for users' scripts.

Horovod: one GPU per local rank when GPUs exist (memory growth on, so TensorFlow does not grab
every GPU's memory). On CPU hosts (either stack) the cores are split between the host's ranks,
because each TensorFlow process would otherwise start a thread per core and the ranks would
fight.
"""

from __future__ import annotations

import os

import tensorflow as tf


def _skip_autograph_of_horovod() -> None:
    """Horovod's Python code (DistributedOptimizer, allreduce, broadcast) has no
    tensor-dependent control flow, but autograph re-parses and converts it in every traced
    function that calls it: the first step came ~1 s sooner without.
    TensorFlow-internal API, fine while TensorFlow is pinned (2.15.1)."""
    from tensorflow.python.autograph.core import config as autograph_config

    rules = autograph_config.CONVERSION_RULES
    if not any(
        isinstance(rule, autograph_config.DoNotConvert) and rule.matches("horovod")
        for rule in rules
    ):
        autograph_config.CONVERSION_RULES = (autograph_config.DoNotConvert("horovod"), *rules)


def start_horovod() -> None:
    import horovod.tensorflow.keras as hvd

    hvd.init()
    _skip_autograph_of_horovod()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[hvd.local_rank() % len(gpus)]
        tf.config.set_visible_devices(gpu, "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
        return
    share_cores(hvd.local_size())


def share_cores(local_size: int) -> None:
    """A CPU host's cores split between its `local_size` ranks, unless the operator chose."""
    if tf.config.list_physical_devices("GPU") or "TF_NUM_INTRAOP_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
