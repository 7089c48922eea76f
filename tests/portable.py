"""Call an exported SavedModel the way any SavedModel consumer does: a fresh Python process in
which Keras cannot even be imported loads it with tf.saved_model.load and calls its
serving_default signature."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

PROGRAM = """
import json, sys
sys.modules["keras"] = sys.modules["tf_keras"] = None  # importing Keras now fails
import numpy as np
import tensorflow as tf
for library in sys.argv[3:]:
    tf.load_op_library(library)
signature = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
(name, spec), = signature.structured_input_signature[1].items()
rows = np.load(sys.argv[2])
outputs = signature(**{name: tf.constant(rows, spec.dtype)})
print(json.dumps({"input": [name, spec.shape.as_list(), spec.dtype.name],
                  "outputs": {key: value.numpy().tolist() for key, value in outputs.items()}}))
"""


def call_savedmodel(path: Path, rows: np.ndarray, scratch: Path, *op_libraries: str) -> dict:
    """{"input": [name, shape, dtype], "outputs": {name: values}} from a Keras-free process
    that imports only TensorFlow, after loading `op_libraries` (custom ops' .so files)."""
    np.save(scratch / "rows.npy", rows)
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(path), str(scratch / "rows.npy"), *op_libraries],
        capture_output=True,
        text=True,
        timeout=300,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
