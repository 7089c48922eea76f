"""Which variables a Keras 3 `ModelParallel` layout shards, said before a job trains them.

Keras matches each `LayoutMap` key with `re.fullmatch` against a variable's whole path
(`sequential/d1/kernel`), and a variable that no key matches is replicated on every device
with no message. keras.io's distribution guide writes `"d1/kernel"`, which matches nothing:
its model trains fully replicated, and a model too big for one device runs out of memory
instead of being split (keras-team/keras-hub#2806 reports the same after a rename). So the
job says, within its first step, which keys matched no variable (with paths that exist, and
the key that would have matched) and when a `ModelParallel` run sharded none of a model's
variables (train.keras_script calls `check` when `fit` makes its train function).

Models that ship no layout (most users' own, KerasHub's `BertBackbone`) get one:
`auto_model_parallel(mesh)` is a `ModelParallel` that shards each kernel and embedding on its
last dimension that the model axis divides, and replicates what has none. The rules here are
pure functions over paths, shapes and partition specs, for the built-in trainer as for
scripts; only `auto_model_parallel` and `check` touch Keras, imported when called.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# What a variable's name ends with when auto_axes shards it: Dense/Conv/EinsumDense kernels
# (recurrent_kernel, depthwise_kernel, ...), Embedding tables (embeddings, reverse_embeddings).
SHARDED_NAMES = ("kernel", "embeddings")
EXAMPLES = 3  # paths shown beside a key that matched none


def matches(key: str, path: str) -> bool:
    """Whether LayoutMap's lookup gives `key`'s layout to `path`: the exact key, or the key as
    a regular expression matching the whole path (LayoutMap.__getitem__)."""
    if key == path:
        return True
    try:
        return re.fullmatch(key, path) is not None
    except re.error:
        return False


def unmatched_keys(layout_keys: Iterable[str], variable_paths: Iterable[str]) -> list[str]:
    """The keys, in their order, that match none of the paths."""
    paths = list(variable_paths)
    return [key for key in layout_keys if not any(matches(key, path) for path in paths)]


def searches(key: str, path: str) -> bool:
    """Whether `key` is found inside `path` (what a user who wrote it meant)."""
    try:
        return re.search(key, path) is not None
    except re.error:
        return False


def unmatched_message(key: str, paths: Sequence[str]) -> str:
    """What to tell a user whose layout key matched none of `paths`: examples of the paths
    that exist (variables first, then layer outputs) and, where the key is found inside a path,
    the key that would have matched it."""
    variables = [path for path in paths if not path.endswith("/output")]
    near = [path for path in paths if searches(key, path)]
    examples = (near or variables or list(paths))[:EXAMPLES]
    text = f"layout key {key!r} matched no variable"
    if examples:
        text += "; paths look like " + ", ".join(repr(path) for path in examples)
    if near:
        text += (
            f" (LayoutMap matches a key against the whole path: {'.*' + key!r} would "
            f"match {near[0]!r})"
        )
    return text + "; what no key matches is replicated on every device"


Spec = Sequence[Any]  # a PartitionSpec's entries: None, an axis name, or a tuple of names


def sharded_over(spec: Spec, mesh_shape: Mapping[str, int]) -> int:
    """Over how many devices a variable with this partition spec is split."""
    count = 1
    for entry in spec:
        for axis in entry if isinstance(entry, (tuple, list)) else (entry,):
            if axis is not None:
                count *= mesh_shape.get(axis, 1)
    return count


def splitting_axes(mesh_shape: Mapping[str, int], batch_axis: str) -> list[str]:
    """The mesh's axes that could split a variable: any but the batch axis, of 2 or more."""
    return [axis for axis, size in mesh_shape.items() if axis != batch_axis and size > 1]


@dataclass(frozen=True)
class Replicated:
    """A model parallel run whose model's trainable variables are all whole on every device."""

    model: str
    variables: int
    axes: tuple[str, ...]  # the mesh's axes that could have split them
    paths: tuple[str, ...]  # examples

    def message(self) -> str:
        axes = " and ".join(repr(axis) for axis in self.axes)
        return (
            f"ModelParallel sharded none of the {self.variables} trainable variables of "
            f"model {self.model!r}: each is whole on every device, though the mesh's "
            f"{axes} axis could split them (paths look like "
            f"{', '.join(repr(path) for path in self.paths)}); give LayoutMap keys that "
            "match them, or use train.layouts.auto_model_parallel(mesh)"
        )


def replicated(
    model: str, specs: Mapping[str, Spec], mesh_shape: Mapping[str, int], batch_axis: str
) -> Replicated | None:
    """A Replicated when a mesh with an axis that could split variables left every one of
    `specs` (path -> partition spec) whole; None when one is split or none could be."""
    axes = splitting_axes(mesh_shape, batch_axis)
    if not specs or not axes:
        return None
    if any(sharded_over(spec, mesh_shape) > 1 for spec in specs.values()):
        return None
    return Replicated(model, len(specs), tuple(axes), tuple(list(specs)[:EXAMPLES]))


def auto_axes(
    path: str, shape: Sequence[int], axis_size: int, axis_name: str = "model"
) -> tuple[str | None, ...] | None:
    """The layout auto_model_parallel gives a variable: a kernel or embedding is split along
    `axis_name` on its last dimension that `axis_size` divides; None (replicated) for other
    variables, an axis of 1, or a variable that no dimension of which divides. The last
    dimension is a Dense kernel's outputs and an embedding's features; where outputs do not
    divide (10 classes over 4 devices), the inputs often do, which is also what the layer
    before produced split."""
    name = path.rpartition("/")[2]
    if axis_size <= 1 or len(shape) < 2 or not name.endswith(SHARDED_NAMES):
        return None
    for dimension in reversed(range(len(shape))):
        if shape[dimension] % axis_size == 0:
            axes: list[str | None] = [None] * len(shape)
            axes[dimension] = axis_name
            return tuple(axes)
    return None


def auto_model_parallel(
    device_mesh: Any,
    *,
    model_dim_name: str = "model",
    layout_map: Any = None,
    batch_dim_name: str | None = None,
    auto_shard_dataset: bool = True,
) -> Any:
    """A keras.distribution.ModelParallel over `device_mesh` for a model that ships no
    layout: a key of `layout_map` (optional, keys as Keras matches them) decides where it
    matches; every other kernel and embedding gets auto_axes' layout along `model_dim_name`.

        mesh = keras.distribution.DeviceMesh((1, 4), ["batch", "model"], devices)
        keras.distribution.set_distribution(auto_model_parallel(mesh))

    A LayoutMap cannot do this by itself: its lookup sees a variable's path, not its shape."""
    from keras.distribution import LayoutMap

    if model_dim_name not in device_mesh.axis_names:
        raise ValueError(
            f"auto_model_parallel: the mesh has no axis {model_dim_name!r}; its "
            f"axes are {list(device_mesh.axis_names)}. Pass model_dim_name="
        )
    return _auto_class()(
        layout_map=layout_map if layout_map is not None else LayoutMap(device_mesh),
        batch_dim_name=batch_dim_name,
        auto_shard_dataset=auto_shard_dataset,
        model_dim_name=model_dim_name,
    )


@functools.cache
def _auto_class() -> type:
    """The ModelParallel subclass (defined once keras is imported, by the first call)."""
    from keras.distribution import ModelParallel, TensorLayout

    class AutoModelParallel(ModelParallel):
        """ModelParallel whose variables no key matches get auto_axes' layout."""

        def __init__(self, *, model_dim_name: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.model_dim_name = model_dim_name

        def get_variable_layout(self, variable: Any) -> Any:
            if (
                getattr(variable, "_layout", None) is not None
                or self._layout_map[variable.path] is not None
            ):
                return super().get_variable_layout(variable)  # its own, or a key's
            mesh = self.device_mesh
            size = mesh.shape[list(mesh.axis_names).index(self.model_dim_name)]
            axes = auto_axes(variable.path, variable.shape, size, self.model_dim_name)
            return TensorLayout(axes or (None,) * len(variable.shape), mesh)

    return AutoModelParallel


def check(
    model: Any, distribution: Any, said: set[str], paths: Iterable[str] | None = None
) -> list[str]:
    """What to warn of for `model`, about to train under `distribution`: each layout key that
    matched none of the `paths` (by default those Keras looked up, which train.keras_script
    records; the built-in trainer passes its model's variable paths) (keys in `said` are not
    repeated; they are added), and a model parallel run that split none of the model's
    trainable variables. Empty for any other distribution. Needs keras and jax (both imported
    by then)."""
    from keras.distribution import ModelParallel

    if not isinstance(distribution, ModelParallel):
        return []
    layout_map = distribution._layout_map
    looked_up = sorted(getattr(layout_map, LOOKED_UP, ()) if paths is None else paths)
    texts = [
        unmatched_message(key, looked_up)
        for key in unmatched_keys(list(layout_map), looked_up)
        if key not in said
    ]
    said.update(list(layout_map))
    specs = {
        variable.path: tuple(getattr(variable.value.sharding, "spec", ()))
        for variable in model.trainable_variables
    }
    mesh = distribution.device_mesh
    whole = replicated(
        model.name, specs, dict(zip(mesh.axis_names, mesh.shape)), distribution.batch_dim_name
    )
    return texts + ([whole.message()] if whole else [])


def quantity(count: float) -> str:
    """12600000 -> '12.6M': a count as people read it."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= size:
            return f"{count / size:.1f}{suffix}"
    return f"{count:.0f}"


def megabytes(count: float) -> str:
    """Bytes in MB (kB below one MB: a small model's would read 0.0 MB)."""
    return f"{count / 1e6:.1f} MB" if count >= 1e6 else f"{count / 1e3:.1f} kB"


def footprint(
    variables: Iterable[tuple[Sequence[int], int, Spec]], mesh_shape: Mapping[str, int], axis: str
) -> str:
    """The log's line of what a model weighs, whole and on each device, from each variable's
    (shape, bytes per element, partition spec): "12.6M parameters, 50.4 MB; 6.3 MB per device
    over a model axis of 8"."""
    parameters = total = per_device = 0.0
    for shape, itemsize, spec in variables:
        count = 1
        for dimension in shape:
            count *= int(dimension)
        parameters += count
        total += count * itemsize
        per_device += count * itemsize / sharded_over(spec, mesh_shape)
    return (
        f"{quantity(parameters)} parameters, {megabytes(total)}; {megabytes(per_device)} per "
        f"device over a model axis of {mesh_shape.get(axis, 1)}"
    )


# The attribute train.keras_script sets on a LayoutMap: the paths its lookups were asked for.
LOOKED_UP = "_launcher_looked_up"
