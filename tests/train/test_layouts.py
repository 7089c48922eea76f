"""The pure rules behind script mode's Keras 3 layout warnings, auto layouts and saves across
hosts (train.layouts, train.keras_script); with Keras and JAX they run on 2 containers in
tests/image/test_keras_jax.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from train import jax_arrays, keras_script, layouts

GUIDE_PATHS = [
    "sequential/flatten/output",
    "sequential/d1/kernel",
    "sequential/d1/bias",
    "sequential/d1/output",
    "sequential/d2/kernel",
    "sequential/d2/bias",
    "sequential/d2/output",
]


def test_the_guides_key_matches_no_path_and_the_message_names_the_key_that_would():
    assert layouts.unmatched_keys(
        ["d1/kernel", ".*d2/kernel", "sequential/d1/bias", ".*d2/output", "(bad"], GUIDE_PATHS
    ) == ["d1/kernel", "(bad"]
    assert layouts.unmatched_message("d1/kernel", GUIDE_PATHS) == (
        "layout key 'd1/kernel' matched no variable; paths look like 'sequential/d1/kernel' "
        "(LayoutMap matches a key against the whole path: '.*d1/kernel' would match "
        "'sequential/d1/kernel'); what no key matches is replicated on every device"
    )


def test_a_key_found_in_no_path_is_shown_the_variables_not_the_outputs():
    assert layouts.unmatched_message("encoder/.*", GUIDE_PATHS) == (
        "layout key 'encoder/.*' matched no variable; paths look like 'sequential/d1/kernel', "
        "'sequential/d1/bias', 'sequential/d2/kernel'; what no key matches is replicated on "
        "every device"
    )


MESH = {"data": 1, "model": 4}


def test_a_model_parallel_run_that_split_nothing_is_named():
    specs = {"sequential/d1/kernel": (None, None), "sequential/d1/bias": (None,)}
    found = layouts.replicated("sequential", specs, MESH, "data")
    assert found == layouts.Replicated("sequential", 2, ("model",), tuple(specs))
    assert found.message().startswith(
        "ModelParallel sharded none of the 2 trainable variables "
        "of model 'sequential': each is whole on every device, "
        "though the mesh's 'model' axis could split them"
    )


@pytest.mark.parametrize(
    "specs, mesh",
    [
        ({"k": (None, "model"), "b": (None,)}, MESH),  # one split: fine
        ({"k": (("data", "model"), None)}, MESH),  # split over a tuple of axes
        ({"k": (None, None)}, {"data": 4, "model": 1}),  # nothing could split it
        ({"k": ("data", None)}, {"data": 2, "model": 2}),  # split on the batch axis (FSDP)
    ],
)
def test_no_warning_where_a_variable_is_split_or_nothing_could_split_it(specs, mesh):
    assert layouts.replicated("m", specs, mesh, "data") is None


@pytest.mark.parametrize(
    "path, shape, expected",
    [
        ("sequential/d1/kernel", (784, 200), (None, "model")),
        ("sequential/d2/kernel", (200, 10), ("model", None)),  # 10 classes do not divide by 4
        ("encoder/token_embedding/embeddings", (30522, 768), (None, "model")),
        ("conv/kernel", (3, 3, 16, 32), (None, None, None, "model")),
        ("sequential/d1/bias", (200,), None),  # not a kernel: replicated
        ("odd/kernel", (3, 5), None),  # no dimension divides
    ],
)
def test_auto_axes_split_the_last_dimension_the_model_axis_divides(path, shape, expected):
    assert layouts.auto_axes(path, shape, 4) == expected


def test_auto_axes_split_nothing_over_a_model_axis_of_one():
    assert layouts.auto_axes("d/kernel", (8, 8), 1) is None


def test_only_an_array_some_process_cannot_read_whole_is_gathered():
    halves = {0: {"left"}, 1: {"right"}}  # mesh 1x4 over 2 processes
    rows = {0: {"left", "right"}, 1: {"left", "right"}}  # mesh 2x2: each process a row
    assert not jax_arrays.whole_in_every_process(halves, 2)
    assert jax_arrays.whole_in_every_process(rows, 2)
    assert not jax_arrays.whole_in_every_process({0: {"left", "right"}}, 2)


def test_available_memory_is_the_smaller_of_the_host_and_the_container_limit():
    """The container's page cache is given back on demand: only its anonymous memory counts
    against its limit."""
    meminfo = "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n"
    stat = "anon 1000000000\nfile 5000000000\n"
    assert jax_arrays.available_memory(meminfo, None, None) == 4_096_000_000
    assert jax_arrays.available_memory(meminfo, "max\n", stat) == 4_096_000_000
    assert jax_arrays.available_memory(meminfo, "3000000000\n", stat) == 2 * 10**9
    assert jax_arrays.available_memory(meminfo, "500000000\n", stat) == 0
    # cgroup v1 (podman on a v1 host): no limit is a huge number; total_rss is the anon part
    v1_stat = "cache 5000000000\nrss 4812800\ntotal_rss 1000000000\n"
    assert jax_arrays.available_memory(meminfo, "9223372036854771712\n", v1_stat) == 4_096_000_000
    assert jax_arrays.available_memory(meminfo, "3000000000\n", v1_stat) == 2 * 10**9


def test_a_call_that_cannot_fit_a_host_says_what_to_call_instead():
    hosts = [(0, 2**32), (1, 2**31)]
    instead = keras_script.SAVE_SHARDED
    assert jax_arrays.too_large("model.save", "its largest variable", 2**30, hosts, instead) is None
    said = jax_arrays.too_large("get_weights", "the model's weights", 3 * 2**30, hosts, instead)
    assert said.startswith(
        "get_weights gathers the model's weights (3.0 GiB) onto every "
        "process, but process 1's host has 2.0 GiB of memory free. Save the "
        "model sharded instead"
    ), said
    assert "addressable_shards" in said


def test_a_save_writes_a_hidden_file_with_the_same_ending_beside_its_target(tmp_path):
    target = tmp_path / "model.keras"
    assert keras_script.partial_path(target, 42) == tmp_path / ".42.partial.model.keras"
    assert keras_script.local_file(str(target), {}) == target
    for filepath, kwargs in (
        (str(target), {"zipped": False}),
        ("gs://bucket/m.keras", {}),
        (str(tmp_path / "w.weights.json"), {"max_shard_size": 1}),
        (None, {}),
    ):
        assert keras_script.local_file(filepath, kwargs) is None


def test_the_import_hook_runs_after_the_module_it_waits_for(tmp_path, monkeypatch):
    """A real import through the real machinery: the callback sees the module executed."""
    (tmp_path / "late_module_for_hook.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = keras_script._AfterImport("late_module_for_hook", lambda m: seen.append(m.VALUE))
    monkeypatch.setattr(sys, "meta_path", [hook, *sys.meta_path])
    import late_module_for_hook  # noqa: F401

    assert seen == [7]
    assert Path(late_module_for_hook.__file__).parent == tmp_path
    monkeypatch.delitem(sys.modules, "late_module_for_hook")


def test_the_footprint_line_says_parameters_and_bytes_per_device():
    """12.6M float32 parameters, half of them split over a model axis of 8."""
    half = 6_300_000
    line = layouts.footprint(
        [((half,), 4, (None,)), ((half // 100, 100), 4, (None, "model"))],
        {"batch": 1, "model": 8},
        "model",
    )
    assert line == "12.6M parameters, 50.4 MB; 28.4 MB per device over a model axis of 8"
    assert layouts.footprint([((10, 10), 4, (None, None))], {}, "model") == (
        "100 parameters, 0.4 kB; 0.4 kB per device over a model axis of 1"
    )


def test_pieces_are_compared_only_between_the_ranks_that_hold_them():
    """Mesh 1x4 over 2 processes: each holds its own halves of a kernel (no one else holds
    them: nothing to compare) and the whole bias, which both must agree on."""
    left, right, whole = (0, "left"), (0, "right"), (1, "whole")
    agreeing = [{left: "a", whole: "b"}, {right: "c", whole: "b"}]
    assert jax_arrays.differing_pieces(agreeing) == {}
    apart = [{left: "a", whole: "b"}, {right: "c", whole: "x"}]
    assert jax_arrays.differing_pieces(apart) == {whole: ["b", "x"]}
