"""An ordinary Keras script made distributed with train.distributed (script mode example).

Run on SageMaker with the hyperparameter sagemaker_program=keras_script.py and this file in
/opt/ml/code (the SDK's `entry_point`). It reads the SM_* variables SageMaker's framework
containers provide and takes its hyperparameters as command-line arguments, so the same file
runs unmodified under AWS's TensorFlow containers once the `distributed` lines are removed.
Data: CSV files without header, label first (the embedded digits dataset works as is).
"""

import argparse
import glob
import json
import os

import numpy as np
import tensorflow as tf

from train import distributed


def read_csv_folder(folder: str) -> tuple[np.ndarray, np.ndarray]:
    table = np.concatenate(
        [
            np.loadtxt(path, delimiter=",", ndmin=2)
            for path in sorted(glob.glob(os.path.join(folder, "*.csv")))
        ]
    )
    return table[:, 1:].astype("float32") / 16.0, table[:, 0].astype("int64")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    args = parser.parse_args()

    distributed.init()  # distributed: Horovod, one GPU per rank
    x, y = read_csv_folder(os.environ["SM_CHANNEL_TRAIN"])
    x, y = distributed.shard(x, y)  # distributed: this rank's share

    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=x.shape[1:]),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(int(y.max()) + 1, activation="softmax"),
        ]
    )
    optimizer = distributed.optimizer(  # distributed: averaged gradients, scaled rate
        tf.keras.optimizers.Adam(distributed.scale_learning_rate(args.learning_rate))
    )
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=distributed.callbacks(),
        verbose=distributed.verbose(),
    )

    # distributed: rank 0 writes the model for `serve` (its labels: the digits 0-9).
    distributed.export(model, classes=list(range(int(y.max()) + 1)))
    if distributed.is_leader():  # distributed: only the leader writes
        with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "history.json"), "w") as out:
            json.dump(history.history, out, default=float)  # metrics arrive as numpy floats


if __name__ == "__main__":
    main()
