"""The way out of errors we know, in one table: a failure report ends with the hint of the
first pattern its error matches.

A failure reason that only repeats the exception leaves the user to search for it; for the
few errors that this image's own stacks cause (two images, two ways of synchronising ranks,
Keras 2 beside Keras 3) we know the fix, so the report names it. Each hint is short
(HINT_LIMIT bytes): it shares the report's budget with the error's type, message and the
user's file and line (job.protocol.rank_failure), and must never push those out. When the
image changes (a JAX image, say), the text to change is here and nowhere else.
"""

from __future__ import annotations

import re

HINT_LIMIT = 240  # bytes of a hint

KERAS3_UNDER_MWMS = (
    "Keras 3 cannot train under MultiWorkerMirroredStrategy: use tf_keras with it (`tf.keras` "
    "with TF_USE_LEGACY_KERAS=1, the default), or Keras 3 on JAX (KERAS_BACKEND=jax) with "
    "keras.distribution.initialize() and no strategy"
)
NO_HOROVOD = (
    "Horovod is only in the default image (`make build`, TensorFlow 2.15); on this TensorFlow "
    "2.21 image synchronise with tf.distribute.MultiWorkerMirroredStrategy (TF_CONFIG is set "
    "for every rank)"
)
OUT_OF_MEMORY = (
    "out of device memory: lower per_device_batch_size (or your script's batch per device), "
    "or set max_device_batch_size to accumulate gradients over smaller micro-batches"
)
NO_JAX = (
    "Keras 3 across hosts needs the JAX backend, which is in the TensorFlow 2.21 image "
    "(`make build-tf`); there keras.distribution.initialize() finds every process by itself"
)

# (pattern searched in "ExceptionType: message", hint); the first match wins.
HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Keras 3's fit under MWMS on the TensorFlow 2.21 image: `ValueError: Attempt to convert a
    # value (PerReplica:{ 0: <tf.Tensor ...> }) with an unsupported type (<class
    # 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.`
    (re.compile(r"unsupported type \(<class '[\w.]*PerReplica'>\)"), KERAS3_UNDER_MWMS),
    (re.compile(r"No module named '?horovod\b"), NO_HOROVOD),
    (re.compile(r"\bResourceExhaustedError\b|\bOOM when allocating\b"), OUT_OF_MEMORY),
    (re.compile(r"No module named '?jax"), NO_JAX),
)


def hint_for(error: str) -> str | None:
    """The way out of `error` ("ExceptionType: message"), or None when we know none."""
    return next((hint for pattern, hint in HINTS if pattern.search(error)), None)
