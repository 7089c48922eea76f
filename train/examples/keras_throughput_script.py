"""A Keras 3 script in the shape of keras.io's distribution guide that times its own training:
the job `scripts/gpu_check.py` runs through the launcher and bare. It needs only Keras and JAX
(no TensorFlow, no dataset download): the data are synthetic 32x32 colour pictures made from a
seed, the same on every process, and each process feeds its slice of every global batch
(`DataParallel(auto_shard_dataset=False)`: Keras splits only tf.data datasets itself).

`--model-parallel M` (> 1) splits the model over M devices instead: a (data, model) mesh of all
devices and train.layouts.auto_model_parallel's layout (the model ships none), the one line
docs/tensorflow-2.21.md gives scripts; processes that a model axis spans feed the same slice
(job.mesh's arithmetic, as the built-in trainer's).

It prints `THROUGHPUT <samples/s>` (process 0; every epoch but the first, which compiles),
`PROCESSES <count>`, `DEVICES <platform> <count>` and `FOOTPRINT <what the model weighs, whole
and per device>` (train.layouts.footprint, the built-in trainer's line: script mode logs none).
Run bare, `initialize()` finds no cluster and the guide's try/except goes on with one process.
"""

import argparse
import os
import time

import jax
import keras
import numpy as np

from job.mesh import Mesh
from train import layouts

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--samples", type=int, default=32768)
parser.add_argument("--global-batch", type=int, default=512)
parser.add_argument("--width", type=int, default=64, help="filters of the first convolution")
parser.add_argument("--model-parallel", type=int, default=1, help="the mesh's model axis")
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
args, _ = parser.parse_known_args()

try:
    keras.distribution.initialize()
except Exception as error:  # as the guide does
    print(f"could not initialize the distribution: {error}", flush=True)
process, processes = jax.process_index(), jax.process_count()
devices = keras.distribution.list_devices()
mesh = Mesh(processes, jax.local_device_count(), args.model_parallel)
if problem := mesh.problem():
    raise SystemExit(problem)
if args.model_parallel == 1:
    distribution = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
else:
    distribution = layouts.auto_model_parallel(
        keras.distribution.DeviceMesh(
            (mesh.replicas, mesh.model_parallel), ["batch", "model"], devices
        ),
        batch_dim_name="batch",
        auto_shard_dataset=False,
    )
keras.distribution.set_distribution(distribution)
print(f"PROCESSES {processes}", flush=True)
print(f"DEVICES {jax.devices()[0].platform} {len(devices)}", flush=True)

random = np.random.default_rng(7)
pictures = random.random((args.samples, 32, 32, 3), dtype=np.float32)
labels = (pictures[:, ::4, ::4, 0].mean(axis=(1, 2)) * 10).astype(np.int32).clip(0, 9)
local_batch = args.global_batch // mesh.readers
steps = args.samples // args.global_batch
mine = np.arange(steps * args.global_batch).reshape(steps, mesh.readers, local_batch)
mine = mine[:, mesh.reader(process)]
pictures, labels = pictures[mine.ravel()], labels[mine.ravel()]


class Throughput(keras.callbacks.Callback):
    """Samples per second over every epoch but the first (XLA compiles during the first)."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):  # the logs' values are fetched: steps are done
        self.seconds.append(time.perf_counter() - self.started)


keras.utils.set_random_seed(1)
width = args.width
model = keras.Sequential(
    [
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ]
)
device_mesh = distribution.device_mesh
footprint = layouts.footprint(
    (
        (
            weight.shape,
            np.dtype(weight.dtype).itemsize,
            tuple(getattr(weight.value.sharding, "spec", ())),
        )
        for weight in model.weights
    ),
    dict(zip(device_mesh.axis_names, device_mesh.shape)),
    "model",
)
print(f"FOOTPRINT {footprint}", flush=True)
model.compile(
    optimizer=keras.optimizers.Adam(0.001),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
timer = Throughput()
model.fit(
    pictures,
    labels,
    batch_size=local_batch,
    epochs=args.epochs,
    shuffle=False,
    verbose=2,
    callbacks=[timer],
)
timed = timer.seconds[1:] or timer.seconds
if process == 0:
    print(f"THROUGHPUT {len(timed) * steps * args.global_batch / sum(timed):.1f}", flush=True)
    if args.model_dir:
        model.save(os.path.join(args.model_dir, "model.keras"))
else:
    import tempfile

    model.save(os.path.join(tempfile.mkdtemp(), "model.keras"))  # every process takes part
