"""What script mode adds to Keras 3 in a user's script, once the script imports `keras`.

train.script_runner calls `install()` before the script runs; nothing is imported then (a
script that never imports Keras 3 pays nothing, and its backend stays its own choice). When the
script's `import keras` finishes, `patch` changes three things, each said in the log:

- **Layouts** (JAX backend): every LayoutMap lookup is recorded, and when `fit` (or
  `train_on_batch`) first makes a model's train function, before its first step, process 0
  warns of each layout key that matched no variable and of a ModelParallel run that split
  none of the model's variables (train.layouts). Nothing else changes.
- **Saves across hosts** (JAX backend): inside `model.save`, `save_weights` and
  `get_weights`, a variable split over devices of several processes (a model axis across
  hosts) is gathered with `jax.experimental.multihost_utils.process_allgather`, a collective:
  every process must make the same call, as keras.io's guide has every process call
  `model.save` (process 0 into SM_MODEL_DIR, the others to scratch). Keras itself raises
  "Fetching value for jax.Array that spans non-addressable devices" there. Before gathering,
  the processes agree that what the call holds at once fits each host's memory (the whole
  weights for `get_weights`; the largest variable for a save, which Keras writes one variable
  at a time): else every process raises ModelTooLarge, saying what to call instead. Outside
  these calls, reading such a variable raises as before (one process alone would wait
  forever in the collective).
- **No torn files** (any backend): `model.save` and `save_weights` to a local file write
  `.<pid>.partial.<name>` beside it and rename it on success; a failed save leaves nothing
  (Keras leaves a 3 KB broken `.keras` when a variable cannot be read).

Before that, once the script imports JAX (itself, or through Keras), JAX is readied for the
launcher's watchdog, which names a frozen process: `jax.distributed.initialize` takes the
launcher's heartbeat timeout, longer than the watchdog's, unless the script passes its own
(train.jax_heartbeat): keras.distribution.initialize() passes none; and the threads of JAX's
distributed runtime, which wake every few milliseconds, are left out of the rank's pulse, so
that a process waiting in a collective for a frozen one is seen idle
(train.activity.exclude_jax_threads).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from train import activity, jax_heartbeat, layouts
from train.jax_arrays import ModelTooLarge as ModelTooLarge  # what a script may catch
from train.jax_arrays import agree_fits, gib, nbytes, spans_processes
from train.logs import log


def install() -> None:
    """Patch JAX and Keras 3 now where the script's process already imported them, else once
    it imports them."""
    for name, callback in (("jax", _for_the_watchdog), ("keras", patch)):
        if name in sys.modules:
            callback(sys.modules[name])
        elif not any(
            isinstance(finder, _AfterImport) and finder.name == name for finder in sys.meta_path
        ):
            sys.meta_path.insert(0, _AfterImport(name, callback))


def _for_the_watchdog(jax: Any) -> None:
    jax_heartbeat.lengthen(jax, say)
    activity.exclude_jax_threads(jax)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` once the module `name` has been imported: its spec is found
    by the other finders, and that spec's own loader runs `callback` after executing it."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name, self.callback, self.busy = name, callback, False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback = spec.loader, self.callback
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            del loader.exec_module  # the loader's own again
            callback(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's loader only
        return spec


def say(text: str) -> None:
    """One line in the job's log (train.logs: the leader's), on stderr as a warning: the
    launcher's word on the script, though said from inside its process."""
    log.warning(f"launcher: {text}")


def patch(keras: Any) -> None:
    """Install the changes the module docstring lists into this process's Keras 3."""
    version = str(getattr(keras, "__version__", ""))
    if not version.startswith("3.") or getattr(keras, "_launcher_patched", False):
        return  # Keras 2, a user's own `keras` module, or done already
    keras._launcher_patched = True
    from keras.src.saving import saving_api

    jax_backend = keras.backend.backend() == "jax"
    for name in ("save_model", "save_weights"):
        wrapped = _saving(getattr(saving_api, name), name, gather=jax_backend)
        setattr(saving_api, name, wrapped)  # Model.save/save_weights call it through here
        for public in (keras.saving, keras.models):
            if getattr(public, name, None) is not None:
                setattr(public, name, wrapped)
    if jax_backend:
        _patch_layouts(keras)
        _patch_reads(keras)


# --- layouts -----------------------------------------------------------------------------


def _patch_layouts(keras: Any) -> None:
    from keras.src.backend.jax.trainer import JAXTrainer

    layout_map_class = keras.distribution.LayoutMap
    lookup = layout_map_class.__getitem__

    @functools.wraps(lookup)
    def __getitem__(self: Any, key: str) -> Any:
        self.__dict__.setdefault(layouts.LOOKED_UP, set()).add(key)
        return lookup(self, key)

    layout_map_class.__getitem__ = __getitem__
    make = JAXTrainer.make_train_function

    @functools.wraps(make)
    def make_train_function(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = make(self, *args, **kwargs)
        if not getattr(self, "_launcher_layouts_checked", False):
            self._launcher_layouts_checked = True
            distribution = keras.distribution.distribution()
            layout_map = getattr(distribution, "_layout_map", None)
            judged = (
                layout_map.__dict__.setdefault("_launcher_judged", set())
                if layout_map is not None
                else set()
            )
            for text in layouts.check(self, distribution, judged):
                say(f"WARNING: {text}")
        return result

    JAXTrainer.make_train_function = make_train_function


# --- saves across hosts -------------------------------------------------------------------

_local = threading.local()  # .call: the save or get_weights under way in this thread


# What a script does instead when a gathered save cannot fit (train.jax_arrays.too_large).
SAVE_SHARDED = (
    "Save the model sharded instead, each process writing its own shards (for each "
    "variable, `variable.value.addressable_shards`: each shard's `.index` and `.data`), or "
    "give each host more memory"
)


def _variables(model: Any, call: str) -> list:
    """The variables `call` reads: the weights, or for a save every variable Keras saves."""
    if call == "get_weights":
        return list(model.weights)
    found = list(getattr(model, "variables", ()))
    optimizer = getattr(model, "optimizer", None)
    found += list(getattr(optimizer, "variables", ()) or ())
    return found


@contextlib.contextmanager
def gathering(model: Any, call: str) -> Iterator[None]:
    """Within: a read of a variable that spans processes gathers it (every process must be
    making the same call). Checks first, with every process, that it fits each host."""
    if getattr(_local, "call", None) is not None:
        yield  # inside another (model.save calls saving_api.save_model)
        return
    variables = [v for v in _variables(model, call) if hasattr(v, "value")]
    spanning = [v for v in variables if spans_processes(v.value)]
    if not spanning:
        yield
        return
    import jax

    sizes = [nbytes(v) for v in (variables if call == "get_weights" else spanning)]
    need = sum(sizes) if call == "get_weights" else max(sizes)
    what = "the model's weights" if call == "get_weights" else "its largest variable"
    agree_fits(call, what, need, SAVE_SHARDED)
    if call not in _said:
        _said.add(call)
        say(
            f"{call} gathers the shards of {len(spanning)} variables "
            f"({gib(sum(nbytes(v) for v in spanning))}) from {jax.process_count()} processes "
            "onto every process, so that process 0 holds the whole model; every process must "
            f"call {call} (train.keras_script)"
        )
    _local.call = call
    try:
        yield
    finally:
        _local.call = None


_said: set[str] = set()


def _patch_reads(keras: Any) -> None:
    """Variables read whole inside `gathering`; get_weights runs inside it."""
    from keras.src.backend.jax.core import JaxVariable
    from keras.src.layers.layer import Layer

    read = JaxVariable.__array__

    def __array__(self: Any, dtype: Any = None) -> Any:
        if getattr(_local, "call", None) is not None and spans_processes(self.value):
            import numpy as np
            from jax.experimental import multihost_utils

            return np.asarray(
                multihost_utils.process_allgather(self.value, tiled=True), dtype=dtype
            )
        return read(self, dtype)

    JaxVariable.__array__ = __array__
    get_weights = Layer.get_weights

    @functools.wraps(get_weights)
    def gathered_weights(self: Any) -> Any:
        with gathering(self, "get_weights"):
            return get_weights(self)

    Layer.get_weights = gathered_weights


# --- no torn files ------------------------------------------------------------------------


def partial_path(target: Path, pid: int) -> Path:
    """Where a save to `target` writes first: beside it (one file system, so the rename is
    atomic), hidden, and ending as `target` does (Keras picks the format by the ending)."""
    return target.with_name(f".{pid}.partial.{target.name}")


def local_file(filepath: Any, kwargs: Mapping[str, Any]) -> Path | None:
    """The local file a save writes, or None where it writes something else (a folder with
    zipped=False, shards with max_shard_size, a remote or file-like target)."""
    if (
        not isinstance(filepath, (str, os.PathLike))
        or kwargs.get("zipped") is False
        or kwargs.get("max_shard_size") is not None
    ):
        return None
    text = os.fspath(filepath)
    if "://" in text or text.endswith(".weights.json"):
        return None
    return Path(text)


def _saving(save: Callable[..., Any], call: str, gather: bool) -> Callable[..., Any]:
    name = "model.save" if call == "save_model" else "save_weights"

    @functools.wraps(save)
    def wrapper(model: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        context = gathering(model, name) if gather else contextlib.nullcontext()
        target = local_file(filepath, kwargs)
        overwrite = args[0] if args else kwargs.get("overwrite", True)
        if target is None or (not overwrite and target.exists()):
            with context:
                return save(model, filepath, *args, **kwargs)
        partial = partial_path(target, os.getpid())
        try:
            with context:
                result = save(model, partial, *args, **kwargs)
            os.replace(partial, target)
        except BaseException:
            if partial.exists():
                partial.unlink()
                say(f"{name} to {target} failed: its partial file was removed")
            raise
        return result

    return wrapper
