"""Sharded checkpoints (train.sharded_checkpoint) without JAX: which process writes which
block, the files each host writes, the union of hosts' folders as S3 merges them, a
half-synced or cut-short copy refused with what is missing named, blocks of another layout
assembled exactly from the stored ones, and the hosts' files shared over real MPI processes (a
restart inside the job, before S3 merged them). JAX's part (its shardings, 2 processes on
loopback) is tests/image/test_sharded_checkpoints.py and, in the built-in trainer,
tests/image/test_model_parallel.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import ROOT
from train.sharded_checkpoint import (
    IncompleteCheckpoint,
    VariableSpec,
    held_files,
    owned_regions,
    read_manifest,
    read_whole,
    region_of,
    transfers,
    unique_names,
    write_process_files,
)

# Mesh 1x4 over 2 processes of 2 devices (devices 0, 1 on process 0; 2, 3 on process 1), as
# (process, region) per device: a kernel split on its last axis, and a replicated bias.
KERNEL = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
BIAS = np.arange(12, dtype=np.float32) - 5
STEP = np.array(7, dtype=np.int64)  # a scalar, as an optimizer's iteration count
HALF = np.arange(8 * 4, dtype=ml_dtypes.bfloat16).reshape(8, 4) / 3


def split(shape, axis, parts):
    size = shape[axis] // parts
    return [
        tuple(
            (part * size, (part + 1) * size) if d == axis else (0, n) for d, n in enumerate(shape)
        )
        for part in range(parts)
    ]


def layout_1x4(shape, axis):
    """Each of the 4 devices' region, split along `axis` (None: replicated)."""
    if axis is None:
        return [(device // 2, tuple((0, n) for n in shape)) for device in range(4)]
    return [(device // 2, region) for device, region in enumerate(split(shape, axis, 4))]


VARIABLES = {
    "sequential/d1/kernel": (KERNEL, layout_1x4(KERNEL.shape, 1)),
    "sequential/d1/bias": (BIAS, layout_1x4(BIAS.shape, None)),
    "adam/iterations": (STEP, layout_1x4((), None)),
    "sequential/d2/kernel": (HALF, layout_1x4(HALF.shape, 0)),
}
SPECS = [VariableSpec(name, v.shape, v.dtype.name) for name, (v, _) in VARIABLES.items()]


def save_as(process: int, folder: Path, processes: int = 2) -> None:
    """What save_arrays does in `process`: the blocks it is the lowest holder of."""
    blocks = [
        (name, region, values[tuple(slice(a, b) for a, b in region)])
        for name, (values, holders) in VARIABLES.items()
        for region in owned_regions(holders, process)
    ]
    write_process_files(folder, process, processes, SPECS, blocks)


def saved_on_two_hosts(tmp_path) -> tuple[Path, Path]:
    hosts = tmp_path / "algo-1" / "epoch-000003", tmp_path / "algo-2" / "epoch-000003"
    for process, folder in enumerate(hosts):
        save_as(process, folder)
    return hosts


def merged(tmp_path, *folders) -> Path:
    """The S3 prefix restored into a host: the union of the hosts' folders."""
    union = tmp_path / "restored" / "epoch-000003"
    for folder in folders:
        shutil.copytree(folder, union, dirs_exist_ok=True)
    return union


def test_each_block_is_written_once_by_the_lowest_process_holding_it():
    kernel, bias = VARIABLES["sequential/d1/kernel"][1], VARIABLES["sequential/d1/bias"][1]
    assert owned_regions(kernel, 0) == [((0, 8), (0, 3)), ((0, 8), (3, 6))]
    assert owned_regions(kernel, 1) == [((0, 8), (6, 9)), ((0, 8), (9, 12))]
    assert owned_regions(bias, 0) == [((0, 12),)]  # 4 devices hold it, process 0 writes it
    assert owned_regions(bias, 1) == []
    # mesh 2x2 with the model axis inside each process: both processes hold the same halves
    inside = [(device // 2, region) for device, region in enumerate(split((8, 12), 1, 2) * 2)]
    assert owned_regions(inside, 0) == split((8, 12), 1, 2) and owned_regions(inside, 1) == []


def test_region_of_reads_jax_indexes_and_refuses_strides():
    assert region_of((slice(None), slice(3, 6)), (8, 12)) == ((0, 8), (3, 6))
    assert region_of((), ()) == ()
    with pytest.raises(ValueError, match="contiguous"):
        region_of((slice(0, 8, 2),), (8,))


def test_hosts_write_disjoint_names_whose_union_restores_every_value(tmp_path):
    first, second = saved_on_two_hosts(tmp_path)
    names = [sorted(p.name for p in (f / "shards").iterdir()) for f in (first, second)]
    assert names == [
        ["process-00000-of-00002.json", "process-00000-of-00002.npz"],
        ["process-00001-of-00002.json", "process-00001-of-00002.npz"],
    ]
    manifest = read_manifest(merged(tmp_path, first, second))
    assert manifest.processes == 2 and list(manifest.variables) == list(VARIABLES)
    assert len(manifest.shards["sequential/d1/bias"]) == 1  # replicated, stored once
    for name, (values, _) in VARIABLES.items():
        whole = tuple((0, n) for n in values.shape)
        got = manifest.assemble(name, whole)
        assert got.dtype == values.dtype and np.array_equal(got, values), name
    manifest.close()


@pytest.mark.parametrize(
    "region",
    [
        ((0, 4), (0, 12)),  # mesh 2x2, rows split: one half of each of 4 stored blocks
        ((0, 8), (0, 6)),  # 2 processes x 1 device: two whole stored blocks
        ((2, 7), (5, 11)),  # any block: parts of three stored blocks
        ((0, 8), (4, 4)),  # an empty block
    ],
)
def test_a_block_of_another_layout_is_assembled_exactly(tmp_path, region):
    manifest = read_manifest(merged(tmp_path, *saved_on_two_hosts(tmp_path)))
    got = manifest.assemble("sequential/d1/kernel", region)
    assert np.array_equal(got, KERNEL[tuple(slice(a, b) for a, b in region)])
    manifest.close()


def test_a_half_synced_prefix_is_refused_naming_the_missing_process(tmp_path):
    first, second = saved_on_two_hosts(tmp_path)
    with pytest.raises(IncompleteCheckpoint) as raised:
        read_manifest(merged(tmp_path, first))
    assert "2 of 4 files missing (process-00001-of-00002.json; process-00001-of-00002.npz)" in str(
        raised.value
    )
    assert raised.value.exit_code == 2


def test_a_write_cut_before_its_rename_does_not_count(tmp_path):
    first, second = saved_on_two_hosts(tmp_path)
    (second / "shards" / "process-00001-of-00002.json").rename(
        second / "shards" / ".process-00001-of-00002.json.partial"
    )
    with pytest.raises(
        IncompleteCheckpoint, match=r"1 of 4 files missing \(process-00001-of-00002.json\)"
    ):
        read_manifest(merged(tmp_path, first, second))


def test_a_data_file_cut_short_is_refused(tmp_path):
    union = merged(tmp_path, *saved_on_two_hosts(tmp_path))
    data = union / "shards" / "process-00001-of-00002.npz"
    size = data.stat().st_size
    data.write_bytes(data.read_bytes()[: size // 2])
    with pytest.raises(IncompleteCheckpoint, match=f"holds {size // 2} of its {size} bytes"):
        read_manifest(union)


def test_files_of_two_process_counts_in_one_folder_are_refused(tmp_path):
    union = merged(tmp_path, *saved_on_two_hosts(tmp_path))
    save_as(0, union, processes=1)
    with pytest.raises(IncompleteCheckpoint, match=r"files of \[1, 2\] processes"):
        read_manifest(union)


def test_shards_that_miss_or_overlap_values_are_refused(tmp_path):
    spec = [VariableSpec("k", (4,), "float32")]
    gap = [("k", ((0, 2),), np.zeros(2, "float32"))]
    write_process_files(tmp_path / "gap", 0, 1, spec, gap)
    with pytest.raises(IncompleteCheckpoint, match="k: its shards hold 2 of its 4 values"):
        read_manifest(tmp_path / "gap")
    overlap = gap + [("k", ((1, 4),), np.zeros(3, "float32"))]
    write_process_files(tmp_path / "overlap", 0, 1, spec, overlap)
    with pytest.raises(
        IncompleteCheckpoint, match=r"shards \(\(0, 2\),\) and \(\(1, 4\),\) overlap"
    ):
        read_manifest(tmp_path / "overlap")


def test_a_model_that_changed_is_named(tmp_path):
    manifest = read_manifest(merged(tmp_path, *saved_on_two_hosts(tmp_path)))
    wanted = [
        *SPECS[:1],
        VariableSpec("sequential/d1/bias", (16,), "float32"),
        VariableSpec("new", (1,), "float32"),
    ]
    with pytest.raises(IncompleteCheckpoint) as raised:
        manifest.check_holds(wanted)
    assert (
        "sequential/d1/bias is float32[12] there, float32[16] in the model; new is not in it"
    ) in str(raised.value)
    manifest.check_holds(SPECS)  # the same model: nothing raised


def test_a_whole_model_is_read_from_the_merged_shards_and_refused_from_one_host(tmp_path):
    """A job resumed without a model axis across processes reads each variable whole."""
    first, second = saved_on_two_hosts(tmp_path)
    values = read_whole(merged(tmp_path, first, second), SPECS)
    for got, (want, _) in zip(values, VARIABLES.values()):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    with pytest.raises(IncompleteCheckpoint, match="2 of 4 files missing"):
        read_whole(first, SPECS)


def test_each_missing_file_comes_from_the_lowest_holder_of_its_whole_copy():
    held = [
        {"a.json": 10, "a.npz": 100},  # process 0 wrote a
        {"a.json": 10, "a.npz": 40, "b.json": 12},  # a cut-short copy of a.npz
        {"b.json": 12, "b.npz": 90},
        {"b.json": 12, "b.npz": 90},  # a process sharing process 2's disk
    ]
    assert transfers(held) == [
        ("a.json", 0, 2),
        ("a.json", 0, 3),
        ("a.npz", 0, 1),
        ("a.npz", 0, 2),
        ("a.npz", 0, 3),
        ("b.json", 1, 0),
        ("b.npz", 2, 0),
        ("b.npz", 2, 1),
    ]
    assert transfers([{"a.json": 1}, {"a.json": 1}]) == []  # S3 restored both: nothing sent


SHARE = """
import os, sys
from pathlib import Path
from mpi4py import MPI
from train import sharded_checkpoint
sharded_checkpoint.CHUNK = 1000  # several pieces per file
folder = Path(sys.argv[1 + MPI.COMM_WORLD.Get_rank()])
received = sharded_checkpoint.share_files(folder, MPI.COMM_WORLD)
# one write per line: the two processes share the pipe, and print() writes its pieces apart
os.write(1, f"RECEIVED {MPI.COMM_WORLD.Get_rank()} {received}\\n".encode())
"""


def test_processes_send_each_other_the_files_their_hosts_lack(tmp_path):
    """A restart inside the job: each host holds only its own files (and here a half-written
    one); afterwards each holds the whole checkpoint, byte for byte, as after S3's merge."""
    first, second = saved_on_two_hosts(tmp_path)
    (second / "shards" / "process-00000-of-00002.json").write_text("{")  # cut short
    whole = merged(tmp_path, *saved_on_two_hosts(tmp_path / "again"))
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    result = subprocess.run(
        [*command, sys.executable, "-c", SHARE, str(first), str(second)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RECEIVED 0 ['process-00001-of-00002.json', 'process-00001-of-00002.npz']" in (
        result.stdout
    )
    assert (
        "RECEIVED 1 ['process-00000-of-00002.json', 'process-00000-of-00002.npz']"
    ) in result.stdout
    for folder in (first, second):
        assert held_files(folder) == held_files(whole)
        for name in held_files(whole):
            assert (folder / "shards" / name).read_bytes() == (whole / "shards" / name).read_bytes()
        assert not [p.name for p in (folder / "shards").iterdir() if "partial" in p.name]
        assert [a.shape for a in read_whole(folder, SPECS)] == [s.shape for s in SPECS]


def test_repeated_names_get_a_suffix():
    assert unique_names(["a", "b", "a", "a"]) == ["a", "b", "a#1", "a#2"]


def test_the_module_imports_no_jax():
    """The unit venv has no JAX, and a script that never uses sharded checkpoints pays nothing."""
    check = "import sys, train.sharded_checkpoint; print(sorted({'jax', 'tensorflow'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr
