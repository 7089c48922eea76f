"""The served model: `load()` it, then `predict()` batches once it is `ready`.

Which model: the one metadata.json names (`model_path`), else the one the model directory
holds in any layout a TensorFlow model arrives in, as TensorFlow Serving finds it:
  /opt/ml/model/saved_model.pb                   the directory itself
  /opt/ml/model/<version>/saved_model.pb         TF Serving's base path
  /opt/ml/model/<name>/<version>/saved_model.pb  SageMaker's TF Serving layout (the exporter's)
  /opt/ml/model/<name>/saved_model.pb            a script's model.save(SM_MODEL_DIR/<name>)
  /opt/ml/model/<name>.keras                     a script's model.save(SM_MODEL_DIR/<name>.keras)
The highest numeric version wins; several differently named models are refused, naming them.
A `.keras` file is loaded by the image's own Keras (Keras 3 on the TensorFlow 2.21 image, so
a model a Keras 3 script trained on JAX is served; tf.keras 2.15 on the Horovod image), on
its TensorFlow backend, and called like a SavedModel without a signature (below).

How it is called: through its `serving_default` signature (input names, shapes and dtypes from
the signature; outputs by name), which any SavedModel consumer uses. A Keras SavedModel saved
without one (save_traces=False, as older exports of this image) is
rebuilt by Keras and its forward pass traced once. Either way `predict` calls one concrete
function, not `keras.Model.predict`, which builds a tf.data pipeline and callbacks on every call
(milliseconds even for one row), nor the revived Keras model eagerly (layer by layer from
Python, several times slower). After loading, one real prediction warms the model up; only
then is it ready: SageMaker must not route traffic to an endpoint that would answer slowly.

TensorFlow is imported inside `load()`, not at module import, for two reasons: the gunicorn
master imports this package and must never initialise TensorFlow before forking (its thread
pools do not survive a fork), and a worker must answer /ping with 503 within milliseconds of
starting while the import, which takes seconds, is still running in the loading thread.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from job.metadata import METADATA_FILE, ModelLoadError, ModelMetadata
from job.signature import SIGNATURE, SUPPORTED_KINDS, ModelInterface, TensorSpec, pack_outputs
from serve.errors import ModelUnavailable

log = logging.getLogger(__name__)

SAVED_MODEL_FILE = "saved_model.pb"

Feed = dict[str, npt.NDArray[Any]]  # a batch as the model's named inputs
# A loaded model's call: its output tensors by name (TensorFlow publishes no types for them).
ModelCall = Callable[[Feed], dict[str, Any]]


def _latest_version(folder: Path) -> Path | None:
    """`folder` if it holds a SavedModel, else its highest numeric version that does."""
    if (folder / SAVED_MODEL_FILE).is_file():
        return folder
    versions = (
        [
            child
            for child in folder.iterdir()
            if child.name.isdigit() and (child / SAVED_MODEL_FILE).is_file()
        ]
        if folder.is_dir()
        else []
    )
    return max(versions, key=lambda child: int(child.name), default=None)


KERAS_SUFFIX = ".keras"


def find_saved_model(model_dir: Path, metadata: ModelMetadata | None) -> Path:
    """The SavedModel folder or `.keras` file to serve (see the module docstring for the
    layouts)."""
    if metadata is not None:
        named = model_dir / metadata.model_path
        if named.suffix == KERAS_SUFFIX and named.is_file():
            return named
        if not named.is_dir():
            raise ModelLoadError(
                f"the SavedModel directory {named} named by {METADATA_FILE} "
                "model_path does not exist"
            )
        return _latest_version(named) or named
    if not model_dir.is_dir():
        raise ModelLoadError(
            f"no model to serve: {model_dir} does not exist; SageMaker unpacks "
            "the model artifact (model.tar.gz) there"
        )
    found = _latest_version(model_dir)
    if found:
        return found
    models = {
        child.name: path
        for child in sorted(model_dir.iterdir())
        if child.is_dir() and (path := _latest_version(child))
    }
    models |= {
        child.name: child for child in sorted(model_dir.glob(f"*{KERAS_SUFFIX}")) if child.is_file()
    }
    if len(models) == 1:
        return next(iter(models.values()))
    if models:
        raise ModelLoadError(
            f"{model_dir} holds several models ({', '.join(models)}); keep one, "
            f"or add a {METADATA_FILE} whose model_path names the one to serve"
        )
    raise ModelLoadError(
        f"no model to serve: {model_dir} holds no TensorFlow SavedModel ({SAVED_MODEL_FILE} in "
        f"it, in <version>/, <name>/ or <name>/<version>/), no <name>{KERAS_SUFFIX} file and no "
        f"{METADATA_FILE}; save the "
        "model with model.save(os.path.join(os.environ['SM_MODEL_DIR'], 'model')) or "
        "train.distributed.export(model)"
    )


def horovod_op_library() -> Path | None:
    """Horovod's TensorFlow op library, when Horovod is installed (found without importing it:
    horovod.tensorflow imports Keras and Horovod's MPI setup)."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0], "tensorflow").glob("mpi_lib*.so"))
    return found[0] if found else None


def _register_horovod_ops(tf: ModuleType, path: Path) -> None:
    """Let TensorFlow load a SavedModel that uses Horovod's own ops.

    A script's plain model.save keeps the optimizer, Horovod's DistributedOptimizer, whose
    functions use ops that only Horovod's op library registers; TensorFlow refuses to load a
    SavedModel with an op it does not know, even though serving never runs them. So when the
    SavedModel's function library names any, the library is loaded (this image has Horovod).
    """
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / SAVED_MODEL_FILE).read_bytes())
    if any(
        node.op.startswith("Horovod")
        for graph in proto.meta_graphs
        for function in graph.graph_def.library.function
        for node in function.node_def
    ):
        library = horovod_op_library()
        if library is None:
            raise ModelLoadError(
                f"{path} uses Horovod's ops (model.save kept the "
                "DistributedOptimizer) and Horovod is not installed; save with "
                "include_optimizer=False or train.distributed.export"
            )
        tf.load_op_library(str(library))


def _flat_call(signature: Any, inputs: tuple[TensorSpec, ...]) -> ModelCall | None:
    """The signature's graph function called with its flat tensors, or None if this
    TensorFlow has no such function or it does not answer as the signature does.

    Calling a signature binds its keyword arguments to a function type and checks every
    tensor against its spec in Python, about 60 microseconds per call, as long as a small
    model's whole forward pass; the requests are validated against the same specs already
    (serve.validation). So the function behind it is called directly, with the tensors in
    its flat order (the inputs' names sorted, as `tf.nest` flattens a dict) and the
    variables it captures. It is run by name with no attributes: TensorFlow's own flat call
    passes the context's executor type and configuration as attributes of the call, and
    setting an attribute on a function first looks the function up among the registered
    ops, where it is not, and builds that error (with the host name: a system call) before
    trying the functions, three times per call: about 20 microseconds, a third of a small
    model's call. Without them the function runs with the default executor and function
    options. This is TensorFlow's internal interface (pinned: 2.15), so the load checks it
    against the public call on random inputs and keeps the public call if they differ.
    """
    import tensorflow as tf
    from tensorflow.python.eager import context, execute

    graph_name = getattr(getattr(signature, "_inference_function", None), "name", None)
    if not isinstance(graph_name, bytes):
        return None
    function_name, ctx = graph_name.decode(), context.context()
    captured = list(signature.captured_inputs)
    input_names = tf.nest.flatten({spec.name: spec.name for spec in inputs})
    output_names = tf.nest.flatten({name: name for name in signature.structured_outputs})

    def call(feed: Feed) -> dict[str, Any]:
        tensors = [tf.constant(feed[input_name]) for input_name in input_names]
        flat = execute.execute(function_name, len(output_names), tensors + captured, (), ctx)
        return dict(zip(output_names, flat))

    rng = np.random.default_rng(0)
    probe = {
        spec.name: rng.uniform(0, 2, (3, *[d or 2 for d in spec.shape])).astype(spec.dtype)
        for spec in inputs
    }
    try:
        fast, public = call(probe), signature(**probe)
        same = fast.keys() == public.keys() and all(
            np.array_equal(fast[name].numpy(), public[name].numpy()) for name in public
        )
    except Exception as error:  # any failure: keep the public call
        log.warning(
            "calling %s through its flat function failed (%s); using the public call",
            SIGNATURE,
            error,
        )
        return None
    if not same:
        log.warning("the flat function of %s answers differently; using the public call", SIGNATURE)
        return None
    return call


def _spec(name: str, shape: Any, dtype: Any) -> TensorSpec:
    """The TensorSpec of an input TensorFlow declares with a tf.TensorShape and a tf.DType."""
    numpy_dtype = np.dtype(dtype.as_numpy_dtype)
    if numpy_dtype.kind not in SUPPORTED_KINDS:
        raise ModelLoadError(
            f"input {name!r} has dtype {numpy_dtype}; the server feeds numeric "
            "inputs only (JSON, CSV and .npy numbers)"
        )
    if shape.rank is None or shape.rank == 0:
        raise ModelLoadError(
            f"input {name!r} has shape {shape}; the server needs a batch dimension first"
        )
    return TensorSpec(name, tuple(shape.as_list()[1:]), numpy_dtype)


# What loading yields: the model's inputs, its output names and the call that runs it.
_Traced = tuple[tuple[TensorSpec, ...], tuple[str, ...], ModelCall]


def _run(call: ModelCall, output_names: tuple[str, ...], feed: Feed) -> npt.NDArray[Any]:
    outputs = call(feed)
    return pack_outputs({name: outputs[name].numpy() for name in output_names})


def _warm_up(interface: ModelInterface, call: ModelCall) -> None:
    zeros = {
        spec.name: np.zeros((1, *[d or 1 for d in spec.shape]), spec.dtype)
        for spec in interface.inputs
    }
    try:
        outputs = _run(call, interface.outputs, zeros)
    except Exception as error:  # any failure of the model's own graph
        raise ModelLoadError(f"the warm-up prediction failed: {error}") from error
    if interface.classes is not None and (
        len(interface.outputs) != 1 or outputs.shape != (1, len(interface.classes))
    ):
        raise ModelLoadError(
            f"the model outputs shape {list(outputs.shape[1:])} per instance, but "
            f"{METADATA_FILE} lists {len(interface.classes)} classes"
        )


class Model:
    """One TensorFlow model loaded from a model directory; safe to query from any thread."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        self.interface: ModelInterface | None = None
        self._call: ModelCall | None = None
        self._saved_model: object = None  # kept alive: the signature's variables belong to it
        self._failure: str | None = None
        self._loaded = threading.Event()
        self._settled = threading.Event()  # the background load ended, loaded or failed

    @property
    def ready(self) -> bool:
        """True once the model is loaded and has answered its warm-up prediction."""
        return self._loaded.is_set()

    def _unavailable(self) -> ModelUnavailable:
        """Why the model cannot take requests (yet)."""
        if self._failure is not None:
            return ModelUnavailable(f"the model failed to load: {self._failure}")
        return ModelUnavailable("the model is still loading; retry when GET /ping answers 200")

    def check_ready(self) -> ModelInterface:
        """The model's interface; raise ModelUnavailable, saying why, unless the model can take
        requests."""
        interface = self.interface
        # The load sets the interface before `ready`: it is None here only while not ready.
        if self._failure is not None or not self.ready or interface is None:
            raise self._unavailable()
        return interface

    def wait_ready(self, deadline: float) -> ModelInterface:
        """Like check_ready, but a model still loading gets until `deadline`
        (time.monotonic()) to finish. With several workers, /ping answers 200 from the first
        worker whose model is ready while the others are still loading theirs; a request that
        reaches one of those waits for it rather than failing."""
        if not self.ready and self._failure is None:
            self._settled.wait(max(0.0, deadline - time.monotonic()))
        return self.check_ready()

    def load(self) -> ModelInterface:
        """Load, trace and warm up the model and return its interface; raise ModelLoadError
        saying what is wrong."""
        metadata = ModelMetadata.read(self.model_dir)
        path = find_saved_model(self.model_dir, metadata)
        if path.suffix == KERAS_SUFFIX and "keras" not in sys.modules:
            # Keras 3 picks its backend when first imported, which TensorFlow 2.21's import does
            os.environ["KERAS_BACKEND"] = "tensorflow"
        import tensorflow as tf  # here, not at the top: see the module docstring
        from google.protobuf import message

        # TensorFlow takes all of a GPU's memory by default, which would leave nothing for a
        # second worker (SAGEMAKER_MODEL_SERVER_WORKERS > 1) on the same GPU.
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
        if path.suffix == KERAS_SUFFIX:
            return self._finish_load(
                self._keras_forward(tf, _load_keras_file(path), metadata), metadata
            )
        try:
            _register_horovod_ops(tf, path)
            loaded = tf.saved_model.load(str(path))
        except (OSError, ValueError, ImportError, tf.errors.OpError, message.DecodeError) as error:
            raise ModelLoadError(f"{path} is not a loadable SavedModel: {error}") from error
        self._saved_model = loaded
        signature = loaded.signatures.get(SIGNATURE)
        traced = (
            self._from_signature(signature)
            if signature is not None
            else self._from_keras(tf, path, metadata)
        )
        return self._finish_load(traced, metadata)

    def _finish_load(self, traced: _Traced, metadata: ModelMetadata | None) -> ModelInterface:
        inputs, outputs, call = traced
        interface = ModelInterface(
            inputs=inputs, outputs=outputs, classes=metadata.classes if metadata else None
        )
        self.interface, self._call = interface, call
        _warm_up(interface, call)
        # TensorFlow's Python objects (about half a million) never die; frozen, they leave the
        # collector's full passes, which otherwise stop every request thread for ~200 ms
        # every few seconds under load (the whole p99 at concurrency 64).
        gc.freeze()
        self._loaded.set()
        return interface

    def _from_signature(self, signature: Any) -> _Traced:
        specs = signature.structured_input_signature[1]
        inputs = tuple(_spec(name, spec.shape, spec.dtype) for name, spec in sorted(specs.items()))
        call: ModelCall = _flat_call(signature, inputs) or (lambda feed: signature(**feed))
        return inputs, tuple(sorted(signature.structured_outputs)), call

    def _from_keras(self, tf: ModuleType, path: Path, metadata: ModelMetadata | None) -> _Traced:
        """A Keras SavedModel without a serving signature: the Keras model's own inputs."""
        try:
            keras_model = tf.keras.models.load_model(str(path), compile=False)
        except (OSError, ValueError, ImportError, tf.errors.OpError) as error:
            raise ModelLoadError(
                f"{path} has no {SIGNATURE} signature and is not a loadable "
                f"Keras SavedModel: {error}"
            ) from error
        return self._keras_forward(tf, keras_model, metadata)

    def _keras_forward(
        self, tf: ModuleType, keras_model: Any, metadata: ModelMetadata | None
    ) -> _Traced:
        """A Keras model's forward pass on its own inputs, traced once (tf.keras or Keras 3 on
        the TensorFlow backend)."""
        if not getattr(keras_model, "inputs", None):
            raise ModelLoadError(
                f"the Keras model {keras_model.name!r} declares no inputs (a subclassed model "
                "that was never built on a keras.Input); save it as a SavedModel with "
                "model.export(os.path.join(os.environ['SM_MODEL_DIR'], 'model'))"
            )
        names = getattr(keras_model, "input_names", None) or [t.name for t in keras_model.inputs]
        specs = [
            tf.TensorSpec(tuple(t.shape), tf.as_dtype(t.dtype), name)
            for t, name in zip(keras_model.inputs, names)
        ]
        if len(specs) == 1 and metadata and metadata.input_shape:  # the trainer's own exports
            specs = [tf.TensorSpec((None, *metadata.input_shape), tf.float32, specs[0].name)]
        names = list(keras_model.output_names)
        arrange = _keras_arguments(keras_model, [s.name for s in specs])
        forward = tf.function(
            lambda feed: dict(
                zip(names, tf.nest.flatten(keras_model(arrange(feed), training=False)))
            ),
            input_signature=[{s.name: s for s in specs}],
        ).get_concrete_function()
        return tuple(_spec(s.name, s.shape, s.dtype) for s in specs), tuple(names), forward

    def predict(self, batch: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """The model's outputs for a validated batch (see job.signature); ModelUnavailable
        before the model has loaded (the app waits for `ready` first)."""
        call, interface = self._call, self.interface
        if call is None or interface is None:
            raise self._unavailable()
        return _run(call, interface.outputs, interface.feed(batch))

    def load_in_background(self) -> threading.Thread:
        """Start `load()` in a daemon thread; a failure is logged and kept for /ping."""
        thread = threading.Thread(target=self._load_logged, name="model-loader", daemon=True)
        thread.start()
        return thread

    def _load_logged(self) -> None:
        log.info("loading the model from %s", self.model_dir)
        try:
            interface = self.load()
        except ModelLoadError as error:
            self._failure = str(error)
            log.error("the model cannot be served, /ping stays 503: %s", error)
        except Exception as error:  # a bug or an unexpected TensorFlow failure: keep the cause
            self._failure = f"{type(error).__name__}: {error}"
            log.exception("loading the model failed, /ping stays 503")
        else:
            log.info("model ready: %s", interface.describe())
        finally:
            self._settled.set()


def _keras_arguments(keras_model: Any, names: list[str]) -> Callable[[Feed], Any]:
    """How a Keras model takes the server's named inputs: one tensor, a list in the order of
    `names`, or, for a model that declared its inputs as a dict (a KerasHub task's
    {"token_ids", "padding_mask"}), that dict: Keras 3 refuses a list there ("The structure of
    `inputs` doesn't match the expected structure")."""
    try:
        declared = keras_model.input
    except (AttributeError, ValueError):  # tf.keras: a layer with several inbound nodes
        declared = None
    if isinstance(declared, dict):
        by_key = {key: tensor.name for key, tensor in declared.items()}
        if set(by_key.values()) == set(names):
            return lambda feed: {key: feed[name] for key, name in by_key.items()}
    if len(names) > 1:
        return lambda feed: [feed[name] for name in names]
    return lambda feed: feed[names[0]]


def _saved_by(path: Path) -> str:
    """The Keras version a `.keras` file names in its metadata.json ("" if it names none)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return str(json.loads(archive.read("metadata.json")).get("keras_version", ""))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise ModelLoadError(
            f"{path} is not a Keras model file (a zip archive with metadata.json): {error}"
        ) from error


def _load_keras_file(path: Path) -> Any:
    """A `.keras` file loaded by the image's `keras` on its TensorFlow backend (Model.load
    chose it; a model trained on JAX keeps backend-neutral weights)."""
    saved_by = _saved_by(path)
    import keras

    if saved_by.startswith("3.") and keras.__version__.startswith("2."):
        raise ModelLoadError(
            f"{path} was saved by Keras {saved_by}, which this image's Keras "
            f"{keras.__version__} cannot read; serve it with the TensorFlow "
            "2.21 image (make build-tf)"
        )
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ModelLoadError(
            f"Keras was already started on the {backend} backend; the server "
            "calls models through TensorFlow"
        )
    try:
        return keras.models.load_model(str(path), compile=False)
    except Exception as error:  # Keras raises many kinds for a file it cannot read
        raise ModelLoadError(
            f"{path} is not a loadable Keras model: {type(error).__name__}: {error}"
        ) from error
