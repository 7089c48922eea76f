"""The built-in trainer's rank program: `python -m mpi4py -m train.rank_main`."""

from __future__ import annotations

import gc

from container.hyperparameters import parse
from container.launch_config import split_hyperparameters
from container.sagemaker_config import read_hyperparameters
from train.hyperparameters import TrainerConfig
from train.rank import RankContext, run_rank


def main(context: RankContext) -> None:
    _, user, _ = split_hyperparameters(read_hyperparameters(context.paths.hyperparameters))
    config, _ = parse(TrainerConfig, user)
    from train.trainer import train  # TensorFlow loads only after the stop handler is in place

    train(context, config)
    # Everything is written. Without this the interpreter's final garbage collection walks
    # TensorFlow's ~500k objects for about a second before the rank exits (measured in the
    # issue-6 teardown benchmark); frozen objects are skipped. Only for the built-in trainer:
    # a user's script may rely on finalizers.
    gc.freeze()


if __name__ == "__main__":
    run_rank(main)
