"""The built-in trainer's rank program: `python -m mpi4py -m train.rank_main`."""

from __future__ import annotations

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


if __name__ == "__main__":
    run_rank(main)
