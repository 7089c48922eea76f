"""The Keras the built-in trainer builds with, chosen once per rank before anything imports it.

`tf.keras` (Keras 2: tf.keras 2.15 with Horovod, tf_keras 2.21 under MultiWorkerMirroredStrategy),
or Keras 3 on JAX when the job's `backend` hyperparameter is `jax` (the TensorFlow 2.21 image):
train.rank_main sets TRAIN_KERAS_BACKEND before it imports the trainer, so the models,
callbacks and schedule below subclass and build with the Keras that runs them. `ops` is the
matching tensor library (TensorFlow's or keras.ops) for the few formulas the trainer writes.
"""

from __future__ import annotations

import os

import tensorflow as tf

from job.trainer_config import BACKEND_ENV, JAX

if os.environ.get(BACKEND_ENV) == JAX:
    import keras
    from keras import ops
else:
    keras = tf.keras
    ops = tf

ON_JAX = keras is not tf.keras


def has_gpu() -> bool:
    """Whether this rank computes on a GPU (JAX's devices or TensorFlow's)."""
    if ON_JAX:
        import jax

        return jax.devices()[0].platform == "gpu"
    return bool(tf.config.list_physical_devices("GPU"))
