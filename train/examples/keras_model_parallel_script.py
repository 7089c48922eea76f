"""keras.io's distribution guide's ModelParallel code (guides/distribution.py), as a user runs
it under the launcher: `keras.distribution.initialize()`, a (data, model) mesh over every
device of every process, a LayoutMap with the guide's keys, `fit`, then every process calls
`model.save` (process 0 into SM_MODEL_DIR, the others to scratch) and `get_weights`.

Its layers are named d1 and d2, as the guide's keys assume. `--layout-keys` is the guide's
"d1/kernel" by default, which matches no path (`sequential/d1/kernel`): the launcher names it
in the log; ".*d1/kernel" splits d1's kernel over the model axis. `--auto true` uses
train.layouts.auto_model_parallel instead of the LayoutMap.
Process 0 loads what it saved and prints whether its weights equal get_weights()'."""

import argparse
import hashlib
import os
import tempfile

import jax
import keras
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--layout-keys", default="d1/kernel")  # comma-separated
parser.add_argument("--mesh", default="1x4")  # data x model
parser.add_argument("--auto", default="false")
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
args, _ = parser.parse_known_args()

keras.distribution.initialize()
devices = keras.distribution.list_devices()
data_size, model_size = (int(n) for n in args.mesh.split("x"))
mesh = keras.distribution.DeviceMesh(
    shape=(data_size, model_size), axis_names=["data", "model"], devices=devices
)
if args.auto == "true":
    from train.layouts import auto_model_parallel

    distribution = auto_model_parallel(mesh, batch_dim_name="data", auto_shard_dataset=False)
else:
    layout_map = keras.distribution.LayoutMap(mesh)
    for key in args.layout_keys.split(","):
        layout_map[key] = (None, "model")
    distribution = keras.distribution.ModelParallel(
        layout_map=layout_map, batch_dim_name="data", auto_shard_dataset=False
    )
keras.distribution.set_distribution(distribution)
process, processes = jax.process_index(), jax.process_count()

keras.utils.set_random_seed(1)
model = keras.Sequential(
    [
        keras.layers.Input((28, 28, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(200, activation="relu", name="d1"),
        keras.layers.Dropout(0.4),
        keras.layers.Dense(10, activation="softmax", name="d2"),
    ]
)
model.compile(loss="mse", optimizer="adam")
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 28, 28, 1)).astype("float32")
y = rng.normal(size=(128, 10)).astype("float32")
# Each process feeds its slice of every global batch where the data axis spans the processes;
# with one data replica (mesh 1xN) every process feeds the whole batch, the same one.
share = slice(process, None, processes) if data_size >= processes else slice(None)
model.fit(
    x[share],
    y[share],
    batch_size=16 * len(x[share]) // len(x),
    epochs=2,
    verbose=2 if process == 0 else 0,
)
kernel = model.get_layer("d1").kernel
print(f"process {process}: d1 kernel {kernel.value.sharding.spec}", flush=True)

target = os.path.join(args.model_dir if process == 0 else tempfile.mkdtemp(), "model.keras")
model.save(target)
weights = model.get_weights()
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in weights)).hexdigest()
print(f"WEIGHTS process {process}: {digest}", flush=True)
if process == 0:
    keras.distribution.set_distribution(None)  # a plain load, as `serve` does
    loaded = keras.saving.load_model(target)
    same = all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), weights))
    print(f"LOADED {len(loaded.get_weights())} arrays, equal to get_weights: {same}", flush=True)
