"""Channel files of every kind read through the tf.data pipeline, split across readers, and
their errors (in-process, no mpirun)."""

import gzip
import io

import numpy as np
import pytest
import tensorflow as tf

from job.trainer_config import TrainerConfig
from scripts.digits_files import split, write_digits
from train.data import DataError, csv_chunks, list_channel
from train.pipeline import Table, label_lookup, moments, open_source, training_input
from train.sharding import Share, assign, readers


def write(folder, name, content):
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        (folder / name).write_text(content)
    else:
        np.savez(folder / name, **content)


def source(folder, share=None, content_type="", **hyperparameters):
    channel = list_channel("train", folder, content_type)
    return open_source(channel, share or Share(channel.files), TrainerConfig(**hyperparameters))


def drain(source):
    pairs = list(source.samples(None).as_numpy_iterator())
    return np.array([p[0] for p in pairs]), [p[1] for p in pairs]


def test_csv_and_npz_are_read_in_file_order_skipping_hidden_files(tmp_path):
    write(tmp_path, "a.csv", "1,0.5,2\n\n0,1,1\n")
    write(tmp_path, "b.csv", "2,3,4\n")
    write(tmp_path, "_SUCCESS", "")
    write(tmp_path, ".hidden.csv", "garbage")
    x, y = drain(source(tmp_path))
    assert x.dtype == np.float32 and y == [1, 0, 2] and x.tolist() == [[0.5, 2], [1, 1], [3, 4]]
    assert source(tmp_path).labels() == (3, {0, 1, 2})


def test_streamed_csv_gives_what_loadtxt_gives_across_chunks(tmp_path):
    table = np.column_stack([np.arange(20) % 3, np.random.default_rng(0).normal(size=(20, 4))])
    np.savetxt(tmp_path / "a.csv", table, delimiter=",", fmt="%.9g")
    chunks = list(csv_chunks(tmp_path / "a.csv", chunk_lines=7))
    assert [len(y) for _, y in chunks] == [7, 7, 6]
    expected = np.loadtxt(tmp_path / "a.csv", delimiter=",")
    assert np.array_equal(
        np.concatenate([x for x, _ in chunks]), expected[:, 1:].astype(np.float32)
    )
    assert np.concatenate([y for _, y in chunks]).tolist() == expected[:, 0].astype(int).tolist()


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("1,x", "line 700, column 2: 'x' is not a number"),
        ("1,2,3", "line 700 has 3 columns but the file starts with 2"),
        ("1,nan", "line 700 has a NaN or infinite value"),
        ("1.5,2", "line 700 has label 1.5; labels must be integer class numbers"),
    ],
)
def test_csv_errors_name_the_line_counted_from_one_across_chunks(
    tmp_path, monkeypatch, bad_line, message
):
    monkeypatch.setattr("train.data.CSV_CHUNK_LINES", 64)  # line 700 is in the 11th chunk
    lines = ["0,1"] * 699 + [bad_line] + ["1,1"] * 5
    write(tmp_path, "a.csv", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message) as error:
        source(tmp_path).labels()
    assert f"{tmp_path / 'a.csv'}: line 700" in str(error.value)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("a.npz", {"x": np.ones((2, 2))}, "a.npz: NPZ needs arrays x and y; missing y (has x)"),
        (
            "a.npz",
            {"x": np.ones((3, 2)), "y": np.ones(2)},
            "x must be (samples, features...) and y (samples,) of the same length",
        ),
        ("a.npz", {"x": np.array([["a", "b"]]), "y": np.ones(1)}, "x and y must be numeric"),
        (
            "a.npz",
            {"x": np.array([[1.0], [np.inf]]), "y": np.ones(2)},
            "sample 2 (counting from 1) has a NaN",
        ),
        ("a.csv", "1\n2\n", "each row needs a label and at least one feature, found 1 column"),
        ("a.csv", "\n\n", "the file is empty"),
    ],
)
def test_unusable_files_are_named_with_the_problem(tmp_path, name, content, message):
    write(tmp_path, name, content)
    with pytest.raises(DataError) as error:
        source(tmp_path).labels()
    assert message in str(error.value) and name in str(error.value)


def test_a_channel_without_data_files_is_named(tmp_path):
    write(tmp_path / "train", ".hidden.csv", "1,2\n")
    with pytest.raises(DataError, match=f"channel train: {tmp_path / 'train'} has no data files"):
        list_channel("train", tmp_path / "train")


def test_files_of_different_shapes_are_refused(tmp_path):
    write(tmp_path, "a.csv", "1,2,3\n")
    write(tmp_path, "b.csv", "1,2\n")
    with pytest.raises(
        DataError,
        match="b.csv: samples have shape \\(1,\\) but the channel's first file has \\(2,\\)",
    ):
        source(tmp_path).labels()


def test_a_channel_mixing_kinds_or_with_unknown_files_is_refused(tmp_path):
    write(tmp_path / "mixed", "a.csv", "1,2\n")
    write(tmp_path / "mixed", "b.npz", {"x": np.ones((1, 1)), "y": np.ones(1)})
    with pytest.raises(
        DataError, match="channel train mixes kinds of files: a.csv \\(CSV\\), b.npz \\(NPZ\\)"
    ):
        list_channel("train", tmp_path / "mixed")
    write(tmp_path / "unknown", "part-00000", "1,2\n")
    with pytest.raises(DataError, match="part-00000: unsupported file type.*ContentType"):
        list_channel("train", tmp_path / "unknown")
    assert list_channel("train", tmp_path / "unknown", "text/csv; charset=utf-8").kind == "CSV"


def test_readers_are_global_ranks_for_replicated_channels_and_local_ranks_for_sharded_ones():
    assert readers(by_host=False, rank=3, world_size=4, local_rank=1, local_size=2) == (3, 4)
    assert readers(by_host=True, rank=3, world_size=4, local_rank=1, local_size=2) == (1, 2)


def test_enough_files_are_split_by_file_else_records_by_index(tmp_path):
    for index in range(3):
        write(
            tmp_path / "three",
            f"{index}.csv",
            "".join(f"{i % 2},{index * 10 + i}\n" for i in range(4)),
        )
    channel = list_channel("train", tmp_path / "three")
    by_file = [assign(channel.files, r, 2) for r in range(2)]
    assert [[p.name for p in s.files] for s in by_file] == [["0.csv", "2.csv"], ["1.csv"]]
    assert [drain(Table(channel, s))[0][:, 0].tolist() for s in by_file] == [
        [0, 1, 2, 3, 20, 21, 22, 23],
        [10, 11, 12, 13],
    ]
    by_record = [Table(channel, assign(channel.files, r, 5)) for r in range(5)]
    values = [drain(s)[0][:, 0].tolist() for s in by_record]
    assert values[0] == [0, 11, 22] and values[4] == [10, 21]  # global records 0,5,10 and 4,9
    assert sorted(sum(values, [])) == [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]


@pytest.fixture(scope="module")
def tfrecords(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfrecord")
    write_digits(root, "tfrecord", size=16, shards=3)
    return root / "train"


def test_tfrecord_shards_split_by_file_cover_the_channel_once(tfrecords):
    channel = list_channel("train", tfrecords)
    pixels, labels = split()["train"]
    shares = [
        source(tfrecords, assign(channel.files, r, 2), feature_key="features") for r in range(2)
    ]
    counts = [share.labels() for share in shares]
    assert sum(c for c, _ in counts) == len(labels) and counts[0][1] == set(range(10))
    rows = np.concatenate([drain(share)[0] for share in shares])
    expected = pixels.reshape(len(labels), -1)
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, expected.tolist()))


def test_tfrecord_images_decode_to_image_size_and_gzip_is_detected(tmp_path):
    write_digits(tmp_path, "tfrecord", size=16, shards=1, gzip=True)
    assert (tmp_path / "train").glob("*.tfrecord").__next__().read_bytes()[:2] == b"\x1f\x8b"
    images = source(tmp_path / "train", image_size=24)
    assert images.shape == (24, 24, 1)
    x, y = next(images.samples(None).batch(5).as_numpy_iterator())
    assert x.shape == (5, 24, 24, 1) and x.min() >= 0 and x.max() <= 255 and len(y) == 5


def test_a_missing_tfrecord_key_lists_the_keys_the_record_has(tfrecords):
    with pytest.raises(
        DataError,
        match="record 1: no feature 'pixels' \\(the record has: "
        "features, image, label\\); set the feature_key",
    ):
        source(tfrecords, feature_key="pixels")


def test_a_corrupt_tfrecord_names_the_file_and_record(tmp_path, tfrecords):
    folder = tmp_path / "train"
    folder.mkdir()
    data = bytearray(sorted(tfrecords.iterdir())[0].read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte in the middle: that record's CRC fails
    (folder / "a.tfrecord").write_bytes(bytes(data))
    with pytest.raises(DataError, match="a.tfrecord record \\d+: corrupt .*rewrite the shard"):
        source(folder, feature_key="features").labels()


def test_an_image_folder_has_its_folder_names_as_classes_and_names_an_undecodable_file(tmp_path):
    write_digits(tmp_path, "images", size=20)
    images = source(tmp_path / "train")
    count, names = images.labels()
    assert images.shape == (20, 20, 1) and names == {str(d) for d in range(10)}
    assert count == len(split()["train"][1])
    (tmp_path / "train" / "3" / "broken.png").write_bytes(b"\x89PNG not really")
    broken = source(tmp_path / "train")
    with pytest.raises(tf.errors.InvalidArgumentError):
        drain(broken)
    with pytest.raises(DataError, match="3/broken.png: not a decodable JPEG or PNG image"):
        broken.diagnose()


def test_images_outside_class_folders_are_refused(tmp_path):
    write(tmp_path, "x.png", "")
    with pytest.raises(DataError, match="x.png: images must sit in one subfolder per class"):
        list_channel("train", tmp_path)


def test_gzip_content_is_found_from_bytes_not_name(tmp_path, tfrecords):
    plain = sorted(tfrecords.iterdir())[0].read_bytes()
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as file:
        file.write(plain)
    write(tmp_path, "x.tfrecords", "")
    (tmp_path / "x.tfrecords").write_bytes(buffer.getvalue())
    assert source(tmp_path, feature_key="features").labels()[0] > 0


def test_images_in_deeper_folders_belong_to_their_first_level_class(tmp_path):
    write_digits(tmp_path, "images", size=8)
    nested = tmp_path / "train" / "4" / "scans"
    nested.mkdir()
    for path in list((tmp_path / "train" / "4").glob("*.png"))[:3]:
        path.rename(nested / path.name)
    images = source(tmp_path / "train")
    assert images.labels()[1] == {str(d) for d in range(10)}
    assert sum(name == "4" for name in images.names) == sum(
        1 for _ in (tmp_path / "train" / "4").rglob("*.png")
    )


def test_normalisation_statistics_come_from_a_bounded_sample(tmp_path, monkeypatch):
    monkeypatch.setattr("train.pipeline.STATS_SAMPLE", 10)
    write(tmp_path, "a.csv", "".join(f"{i % 2},{i},{2 * i}\n" for i in range(100)))
    count, total, squares = moments(source(tmp_path), seed=0)
    assert count == 10 and total.tolist() == [45, 90] and squares.tolist() == [285, 1140]


def test_a_rank_reads_its_own_csv_files_in_a_new_order_every_pass(tmp_path):
    for index in range(6):
        write(tmp_path, f"{index}.csv", f"{index % 2},{index}\n")
    table = source(tmp_path)
    stream = training_input(
        table, label_lookup([0, 1]), 6, TrainerConfig(shuffle_buffer=1), 3, augment=False
    )
    orders = [tuple(x[:, 0].tolist()) for x, _ in stream.take(4).as_numpy_iterator()]
    assert all(sorted(order) == list(range(6)) for order in orders) and len(set(orders)) > 1
    assert [x[0] for x in drain(table)[0]] == list(range(6))  # no seed: file order
