"""A Keras 3 script in the shape of keras.io's distribution guide (guides/distribution.py):
`keras.distribution.initialize()` with no arguments, wrapped in try/except as the guide does,
then data parallelism over every device of every process and `fit` on a batched tf.data
dataset, which Keras splits between the processes. It knows nothing of this image: the
launcher's environment (KERAS_DISTRIBUTION_*, KERAS_BACKEND=jax) is all it needs. It reads
SM_CHANNEL_TRAIN and SM_MODEL_DIR like any SageMaker script; process 0 saves the model there,
every other process to a scratch folder (each must take part in the save)."""

import argparse
import hashlib
import os
import tempfile

import jax
import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--global-batch", type=int, default=64)
parser.add_argument("--initialize", default="true")
parser.add_argument("--fail-on-process", type=int, default=-1)
parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN"))
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
args, _ = parser.parse_known_args()

if args.initialize == "true":
    try:
        keras.distribution.initialize()
    except Exception as error:  # as the guide does
        print(f"could not initialize the distribution: {error}", flush=True)
process, processes = jax.process_index(), jax.process_count()
devices = keras.distribution.list_devices()
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
print(
    f"process {process} of {processes} on {os.environ['SM_CURRENT_HOST']}: "
    f"{len(devices)} devices, Keras {keras.__version__} on {keras.backend.backend()}",
    flush=True,
)
if process == args.fail_on_process:
    raise ValueError(f"process {process} cannot parse its data")

files = sorted(os.path.join(args.train, name) for name in os.listdir(args.train))
rows = np.concatenate([np.loadtxt(path, delimiter=",", ndmin=2) for path in files])
features, labels = rows[:, 1:].astype("float32") / 16.0, rows[:, 0].astype("int64")
# Whole global batches only: Keras splits each between the processes, and a last, smaller
# batch leaves them disagreeing on the number of steps (measured: the job hangs).
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(
    args.global_batch, drop_remainder=True
)

keras.utils.set_random_seed(1)
inputs = keras.Input(shape=(features.shape[1],))
hidden = keras.layers.Dense(64, activation="relu")(inputs)
model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
model.compile(
    optimizer=keras.optimizers.Adam(0.01),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
history = model.fit(dataset, epochs=args.epochs, verbose=2)

digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights()))
print(f"WEIGHTS process {process}: {digest.hexdigest()}", flush=True)
print(f"ACCURACY {history.history['accuracy'][-1]:.3f}", flush=True)
target = args.model_dir if process == 0 else tempfile.mkdtemp()
model.save(os.path.join(target, "model.keras"))
