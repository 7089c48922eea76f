"""The served model: `load()` it, then `predict()` batches once it is `ready`.

Loading means: read metadata.json, load the Keras SavedModel, wrap its forward pass in one
traced `tf.function` and run one real prediction. Only after that warm-up is the model ready:
the first call of a Keras model builds its graph, which takes far longer than a request may,
and SageMaker must not route traffic to an endpoint that would answer it that slowly.

TensorFlow is imported inside `load()`, not at module import, for two reasons: the gunicorn
master imports this package and must never initialise TensorFlow before forking (its thread
pools do not survive a fork), and a worker must answer /ping with 503 within milliseconds of
starting while the import, which takes seconds, is still running in the loading thread.

`predict` calls the concrete function traced for any batch size, not `keras.Model.predict`,
which builds a tf.data pipeline and callbacks on every call (milliseconds even for one row),
nor the revived Keras model eagerly (layer by layer from Python, several times slower), nor
the `tf.function` wrapper, whose argument dispatch costs a third of a small model's call.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from serve.errors import ModelLoadError, ModelUnavailable
from serve.metadata import ModelMetadata, read_metadata

log = logging.getLogger(__name__)


class Model:
    """One Keras model loaded from a model directory; safe to query from any thread."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        self.metadata: ModelMetadata | None = None
        self._forward: Callable[[np.ndarray], np.ndarray] | None = None
        self._failure: str | None = None
        self._loaded = threading.Event()

    @property
    def ready(self) -> bool:
        """True once the model is loaded and has answered its warm-up prediction."""
        return self._loaded.is_set()

    def check_ready(self) -> None:
        """Raise ModelUnavailable, saying why, unless the model can take requests."""
        if self._failure is not None:
            raise ModelUnavailable(f"the model failed to load: {self._failure}")
        if not self.ready:
            raise ModelUnavailable("the model is still loading; retry when GET /ping answers 200")

    def load(self) -> None:
        """Load, trace and warm up the model; raise ModelLoadError saying what is wrong."""
        metadata = read_metadata(self.model_dir)
        if not metadata.model_path.is_dir():
            raise ModelLoadError(f"the SavedModel directory {metadata.model_path} named by "
                                 "metadata.json model_path does not exist")
        import tensorflow as tf  # here, not at the top: see the module docstring

        # TensorFlow takes all of a GPU's memory by default, which would leave nothing for a
        # second worker (SAGEMAKER_MODEL_SERVER_WORKERS > 1) on the same GPU.
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
        try:
            keras_model = tf.keras.models.load_model(str(metadata.model_path), compile=False)
        except (OSError, ValueError, ImportError, tf.errors.OpError) as error:
            raise ModelLoadError(f"{metadata.model_path} is not a loadable Keras SavedModel: "
                                 f"{error}") from error
        spec = tf.TensorSpec((None, *metadata.input_shape), tf.float32)
        forward = tf.function(lambda batch: keras_model(batch, training=False),
                              input_signature=[spec]).get_concrete_function()
        self._forward = lambda batch: forward(tf.convert_to_tensor(batch)).numpy()
        self.metadata = metadata
        self._warm_up()
        self._loaded.set()

    def _warm_up(self) -> None:
        metadata = self.metadata
        try:
            outputs = self._forward(np.zeros((1, *metadata.input_shape), np.float32))
        except Exception as error:  # any failure of the model's own graph
            raise ModelLoadError(f"the warm-up prediction failed: {error}") from error
        if metadata.classes is not None and outputs.shape != (1, len(metadata.classes)):
            raise ModelLoadError(
                f"the model outputs shape {list(outputs.shape[1:])} per instance, but "
                f"metadata.json lists {len(metadata.classes)} classes")

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """The model's outputs for a validated float32 batch of shape (n, *input_shape)."""
        return self._forward(batch)

    def load_in_background(self) -> threading.Thread:
        """Start `load()` in a daemon thread; a failure is logged and kept for /ping."""
        thread = threading.Thread(target=self._load_logged, name="model-loader", daemon=True)
        thread.start()
        return thread

    def _load_logged(self) -> None:
        log.info("loading the model from %s", self.model_dir)
        try:
            self.load()
        except ModelLoadError as error:
            self._failure = str(error)
            log.error("the model cannot be served, /ping stays 503: %s", error)
        except Exception as error:  # a bug or an unexpected TensorFlow failure: keep the cause
            self._failure = f"{type(error).__name__}: {error}"
            log.exception("loading the model failed, /ping stays 503")
        else:
            log.info("model ready: input shape %s, %s", list(self.metadata.input_shape),
                     f"{len(self.metadata.classes)} classes" if self.metadata.classes
                     else "raw outputs")
