"""Reading channel files and sharding them (no processes)."""

import numpy as np
import pytest

from train.data import DataError, _parse_csv_fast, read_channel, shard


def write(folder, name, content):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(content) if isinstance(content, str) else np.savez(folder / name, **content)


def test_csv_and_npz_files_of_a_channel_are_concatenated_in_order(tmp_path):
    write(tmp_path, "a.csv", "1,0.5,2\n0,1,1\n")
    write(tmp_path, "b.npz", {"x": np.ones((2, 2)), "y": np.array([2, 3])})
    write(tmp_path, "_SUCCESS", "")
    write(tmp_path, ".hidden.csv", "garbage")
    data = read_channel(tmp_path)
    assert data.x.dtype == np.float32 and data.y.tolist() == [1, 0, 2, 3]
    assert data.x.tolist() == [[0.5, 2], [1, 1], [1, 1], [1, 1]]
    assert [p.rsplit("/", 1)[1] for p in data.files] == ["a.csv", "b.npz"]


@pytest.mark.parametrize("name, content, message", [
    ("a.npz", {"x": np.ones((2, 2))}, "a.npz: NPZ needs arrays x and y; missing y (has x)"),
    ("a.npz", {"x": np.ones((3, 2)), "y": np.ones(2)}, "x must be (samples, features...) and y (samples,) of the same length"),
    ("a.npz", {"x": np.array([["a", "b"]]), "y": np.ones(1)}, "x and y must be numeric"),
    ("a.csv", "1\n2\n", "each row needs a label and at least one feature, found 1 column"),
    ("a.csv", "1,2\n1,inf\n", "row 2 has a NaN or infinite feature"),
])
def test_unusable_files_are_named_with_the_problem(tmp_path, name, content, message):
    write(tmp_path, name, content)
    with pytest.raises(DataError) as error:
        read_channel(tmp_path)
    assert message in str(error.value) and name in str(error.value)


def test_files_of_different_shapes_are_refused(tmp_path):
    write(tmp_path, "a.csv", "1,2,3\n")
    write(tmp_path, "b.csv", "1,2\n")
    with pytest.raises(DataError, match="b.csv: samples have shape \\(1,\\) but .*a.csv has \\(2,\\)"):
        read_channel(tmp_path)


def test_pickled_npz_is_refused(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.array([{"a": 1}], dtype=object), y=np.ones(1))
    with pytest.raises(DataError, match="not a readable NPZ file"):
        read_channel(tmp_path)


def test_fully_replicated_shards_by_global_rank_and_s3_sharded_by_local_rank(tmp_path):
    write(tmp_path, "a.csv", "".join(f"{i % 2},{i}\n" for i in range(10)))
    data = read_channel(tmp_path)
    replicated = [shard(data, by_host=False, rank=r, world_size=4, local_rank=r % 2, local_size=2)
                  for r in range(4)]
    assert [s.x[:, 0].tolist() for s in replicated] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    by_host = [shard(data, by_host=True, rank=r, world_size=4, local_rank=r % 2, local_size=2)
               for r in (2, 3)]
    assert [s.x[:, 0].tolist() for s in by_host] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


def test_fast_csv_path_gives_what_loadtxt_gives_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr("train.data.CSV_CHUNK_LINES", 7)  # 3 chunks, the last one short
    table = np.column_stack([np.arange(20) % 3, np.random.default_rng(0).normal(size=(20, 4))])
    np.savetxt(tmp_path / "a.csv", table, delimiter=",", fmt="%.9g")
    assert _parse_csv_fast(tmp_path / "a.csv") is not None  # the fast path took it
    data = read_channel(tmp_path)
    expected = np.loadtxt(tmp_path / "a.csv", delimiter=",")
    assert np.array_equal(data.x, expected[:, 1:].astype(np.float32))
    assert data.y.tolist() == expected[:, 0].astype(int).tolist()


@pytest.mark.parametrize("content, message", [
    ("1,2\n1,2,3\n", "the number of columns changed from 2 to 3 at row 2"),
    ("label,x\n1,2\n", "could not convert string 'label' to float64"),
])
def test_files_the_fast_path_refuses_get_loadtxts_precise_error(tmp_path, content, message):
    write(tmp_path, "a.csv", content)
    assert _parse_csv_fast(tmp_path / "a.csv") is None
    with pytest.raises(DataError, match=message):
        read_channel(tmp_path)
