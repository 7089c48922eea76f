"""The built-in trainer's rank program: `python -P -m mpi4py -m train.rank_main`.

It runs the trainer config and batch plan that the launcher validated (job.rank_job).
"""

from __future__ import annotations

import gc
import os

from job.errors import ConfigError
from job.rank_job import read_rank_job
from job.trainer_config import BACKEND_ENV, JAX
from train.rank import RankContext, run_rank


def main(context: RankContext) -> None:
    job = read_rank_job()
    if job.trainer is None or job.batches is None:
        raise ConfigError(
            f"the launcher planned script mode ({job.program}), not the built-in "
            "trainer; start ranks with `train`"
        )
    os.environ.update(job.worker_environment(context.rank, context.local_rank))
    if job.trainer.backend == JAX:  # before train.framework chooses the Keras to build with
        os.environ.update({BACKEND_ENV: JAX, "KERAS_BACKEND": JAX})
    from train.trainer import train  # TensorFlow loads only after the stop handler is in place

    train(context, job.trainer, job.batches, job.tf_workers)
    # Everything is written. Without this the interpreter's final garbage collection walks
    # TensorFlow's ~500k objects for about a second before the rank exits (measured by
    # `make bench` item 4, teardown); frozen objects are skipped. Only for the built-in trainer:
    # a user's script may rely on finalizers.
    gc.freeze()


if __name__ == "__main__":
    run_rank(main)
