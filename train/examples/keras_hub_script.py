"""A KerasHub fine-tune split across hosts, written as a KerasHub user writes it on a laptop
(keras.io's "Distributed training with Keras 3" Gemma example): a device mesh, the backbone's
own `get_layout_map(mesh)`, `ModelParallel`, the model, `fit`, `model.save`.

Under the launcher the only additions are `keras.distribution.initialize()` (every process of
every host joins one JAX job) and where each process saves: every process calls `model.save`,
process 0 into SM_MODEL_DIR and the others to scratch (the launcher gathers the shards of a
model split across hosts; train.keras_script).

The model is a small `GemmaBackbone` built from a config with random weights, so nothing is
downloaded (a preset would be `keras_hub.models.GemmaCausalLM.from_preset("gemma_2b_en")`,
fetched from Kaggle). The data is random token ids: this shows the mechanics, not a result.
Process 0 loads what it saved and prints whether its weights equal get_weights()'.
"""

import argparse
import os
import tempfile

import jax
import keras
import keras_hub
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--mesh", default="1x4")  # data x model: the model axis across the hosts
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--sequence-length", type=int, default=16)
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
args, _ = parser.parse_known_args()

VOCABULARY_SIZE = 256

keras.distribution.initialize()  # under the launcher: join every process of every host
data_size, model_size = (int(n) for n in args.mesh.split("x"))
device_mesh = keras.distribution.DeviceMesh(
    shape=(data_size, model_size),
    axis_names=["batch", "model"],
    devices=keras.distribution.list_devices(),
)
layout_map = keras_hub.models.GemmaBackbone.get_layout_map(device_mesh)
model_parallel = keras.distribution.ModelParallel(
    layout_map=layout_map, batch_dim_name="batch", auto_shard_dataset=False
)
keras.distribution.set_distribution(model_parallel)
process, processes = jax.process_index(), jax.process_count()

# Heads must split over the model axis: 4 query and 4 key/value heads over 4 devices (with
# one key/value head, building the model fails: an axis of 1 cannot be split 4 ways).
keras.utils.set_random_seed(1)
backbone = keras_hub.models.GemmaBackbone(
    vocabulary_size=VOCABULARY_SIZE,
    num_layers=2,
    num_query_heads=4,
    num_key_value_heads=4,
    hidden_dim=64,
    intermediate_dim=128,
    head_dim=16,
)
gemma_lm = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
gemma_lm.compile(
    optimizer=keras.optimizers.AdamW(learning_rate=1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()],
)
embeddings = backbone.get_layer("token_embedding").embeddings
split = [v for v in backbone.trainable_variables if any(v.value.sharding.spec)]
print(
    f"process {process}: token_embedding {embeddings.value.sharding.spec}; {len(split)} of "
    f"{len(backbone.trainable_variables)} variables split by the backbone's layout",
    flush=True,
)

# Already tokenized: each example's next tokens are its labels. With one data replica (mesh
# 1xN) every process feeds the same whole batches; with the batch axis across processes each
# feeds its own slice of every global batch.
rng = np.random.default_rng(0)
tokens = rng.integers(
    1, VOCABULARY_SIZE, size=(args.steps * args.batch_size, args.sequence_length + 1)
)
x = {
    "token_ids": tokens[:, :-1].astype("int32"),
    "padding_mask": np.ones((len(tokens), args.sequence_length), "int32"),
}
y = tokens[:, 1:].astype("int32")
share = slice(process, None, processes) if data_size >= processes else slice(None)
gemma_lm.fit(
    {name: value[share] for name, value in x.items()},
    y[share],
    batch_size=args.batch_size * len(y[share]) // len(y),
    epochs=1,
    verbose=2 if process == 0 else 0,
)

target = os.path.join(args.model_dir if process == 0 else tempfile.mkdtemp(), "model.keras")
gemma_lm.save(target)
weights = gemma_lm.get_weights()
print(f"SAVED process {process}: {len(weights)} arrays", flush=True)
if process == 0:
    keras.distribution.set_distribution(None)  # a plain load, as `serve` does
    loaded = keras.saving.load_model(target)
    same = all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), weights))
    print(
        f"LOADED {type(loaded).__name__} with {len(loaded.get_weights())} arrays, "
        f"equal to get_weights: {same}",
        flush=True,
    )
