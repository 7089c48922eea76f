"""A training script as written for AWS's TensorFlow containers with
distribution={"multi_worker_mirrored_strategy": {"enabled": True}}: it knows nothing of this
image. It reads TF_CONFIG, SM_CHANNEL_TRAIN and SM_MODEL_DIR, takes its hyperparameters as
arguments, lets the strategy shard the data, and saves the model on the chief only (the other
workers save to a scratch folder, as TensorFlow's guide says every worker must save)."""

import argparse
import hashlib
import json
import os
import tempfile

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN"))
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
parser.add_argument("--fail-on-worker", type=int, default=-1)
args, _ = parser.parse_known_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
tf_config = json.loads(os.environ["TF_CONFIG"])
index, workers = tf_config["task"]["index"], len(tf_config["cluster"]["worker"])
print(
    f"worker {index} of {workers} on {os.environ['SM_CURRENT_HOST']}: "
    f"{strategy.num_replicas_in_sync} replicas, TensorFlow {tf.__version__}, "
    f"tf.keras is {tf.keras.__name__.split('.')[0]}",
    flush=True,
)
if index == args.fail_on_worker:
    raise ValueError(f"worker {index} cannot parse its data")

files = sorted(os.path.join(args.train, name) for name in os.listdir(args.train))
rows = np.concatenate([np.loadtxt(path, delimiter=",", ndmin=2) for path in files])
features, labels = rows[:, 1:].astype("float32") / 16.0, rows[:, 0].astype("int64")
dataset = (
    tf.data.Dataset.from_tensor_slices((features, labels))
    .shuffle(len(labels), seed=1)
    .repeat()
    .batch(args.batch_size * workers)
)

with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.Input((features.shape[1],)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.01),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps, verbose=2)

digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
print(f"WEIGHTS worker {index}: {digest}", flush=True)
print(f"ACCURACY {history.history['accuracy'][-1]:.3f}", flush=True)
target = args.model_dir if index == 0 else tempfile.mkdtemp()
model.save(os.path.join(target, "1"))
