"""Archives built to exhaust the disk or to carry fields no file system takes, unpacked by the
real extraction path (and, where the job would stop, the real `train --dry-run`): each stops
the job with exit code 2 naming the member, before any of that member is written, and the
code folder is left as it was."""

import io
import os
import shutil
import subprocess
import tarfile

import pytest

from container import untar
from container.source_dir import MB, extract
from container.untar import MAX_HEADER_BYTES
from job.errors import ConfigError
from tests.container.test_source_dir import SCRIPT, dry_run, expect_config_error, job

URI = "s3://sm11-jobs/hostile.tar.gz"


def zeros(size: int):
    """A stream of `size` zero bytes that never holds more than a megabyte."""

    class Zeros(io.RawIOBase):
        left = size

        def readable(self):
            return True

        def readinto(self, buffer):
            count = min(len(buffer), self.left)
            buffer[:count] = bytes(count)
            self.left -= count
            return count

    return io.BufferedReader(Zeros())


def archive_of(target, *members, format=tarfile.PAX_FORMAT):
    """A .tar.gz of `members`: (TarInfo, stream of its data or None), written by tarfile."""
    with tarfile.open(target, "w:gz", format=format) as tar:
        for info, data in members:
            tar.addfile(info, data)
    return target


def file_member(name, size=0, data=None, **fields):
    info = tarfile.TarInfo(name)
    info.size = size if data is None else len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    return info, zeros(size) if data is None else io.BytesIO(data)


def a_code_folder(root):
    (root / "code").mkdir()
    (root / "code" / "train.py").write_text("earlier code\n")
    return sorted(path.name for path in root.iterdir())


def assert_left_as_it_was(root, before):
    assert sorted(path.name for path in root.iterdir()) == before  # no staging folder left
    assert [path.name for path in (root / "code").iterdir()] == ["train.py"]
    assert (root / "code" / "train.py").read_text() == "earlier code\n"


def test_a_gzip_bomb_stops_the_job_at_the_member_past_the_limit(make_job, tmp_path):
    """Through the real launcher: 8 MiB of zeros (about 8 KB in the archive) after 600 KiB,
    against submit_directory_max_mb=1: the second file passes the limit and is not written."""
    archive = archive_of(
        tmp_path / "bomb.tar.gz",
        file_member("train.py", data=SCRIPT.encode()),
        file_member("small.bin", 600 * 1024),
        file_member("zeros.bin", 8 * MB),
    )
    assert archive.stat().st_size < 64 * 1024
    root = job(make_job, str(archive), submit_directory_max_mb="1")
    before = a_code_folder(root)
    expect_config_error(
        root,
        f"submit directory {str(archive)!r} cannot be unpacked: member "
        f"'zeros.bin' is {8 * MB} bytes unpacked, which takes the archive's "
        f"files past the limit of {MB} bytes (submit_directory_max_mb=1); leave "
        "large files out of source_dir",
    )
    assert_left_as_it_was(root, before)


def test_a_sparse_member_larger_than_the_disk_is_refused_before_it_is_written(make_job, tmp_path):
    """GNU tar's sparse format: a file of more than the disk's free space, a few hundred
    bytes in the archive. The default limit, half the free space, refuses it through the
    real launcher, and nothing of it is written."""
    sparse = tmp_path / "src" / "holes.bin"
    sparse.parent.mkdir()
    (sparse.parent / "train.py").write_text(SCRIPT)
    declared = shutil.disk_usage(tmp_path).free + 1024 * MB
    with open(sparse, "wb") as handle:
        handle.truncate(declared)
    archive = tmp_path / "sparse.tar.gz"
    subprocess.run(
        [
            "tar",
            "--sparse",
            "-czf",
            str(archive),
            "-C",
            str(sparse.parent),
            "train.py",
            "holes.bin",
        ],
        check=True,
    )
    sparse.unlink()
    assert archive.stat().st_size < 4096
    root = job(make_job, str(archive))
    before = a_code_folder(root)
    expect_config_error(
        root,
        f"member 'holes.bin' is {declared} bytes unpacked",
        "MB free on the code folder's disk; the hyperparameter submit_directory_max_mb sets it",
    )
    assert_left_as_it_was(root, before)


def test_an_archive_within_the_limit_is_unpacked_whole(tmp_path):
    archive = archive_of(
        tmp_path / "s.tar.gz",
        file_member("train.py", data=SCRIPT.encode()),
        file_member("data.bin", MB - len(SCRIPT)),
    )
    (tmp_path / "staging").mkdir()
    extract(archive, tmp_path / "staging", URI, max_mb=1)
    assert (tmp_path / "staging" / "data.bin").stat().st_size == MB - len(SCRIPT)


def pax(name, headers, kind=tarfile.REGTYPE, **fields):
    info, data = file_member(name, data=b"#", **fields)
    info.type, info.pax_headers = kind, headers
    if kind != tarfile.REGTYPE:
        info.size, data = 0, None
    return info, data


HOSTILE = {
    "a NUL byte in a pax path": (
        [pax("plain.py", {"path": "evil\x00.py"})],
        "member 'evil\\x00.py' has a NUL byte in its name",
    ),
    "a NUL byte in a pax linkpath": (
        [pax("link", {"linkpath": "train.py\x00/../../x"}, tarfile.SYMTYPE)],
        "member 'link' has a NUL byte in its link target",
    ),
    "a NaN mtime": (
        [pax("train.py", {"mtime": "nan"})],
        "member 'train.py' has the modification time nan, which is not a time",
    ),
    "an infinite mtime": (
        [pax("train.py", {"mtime": "inf"})],
        "member 'train.py' has the modification time inf, which is not a time",
    ),
    "a pax number that is not one (found by fuzzing)": (
        [pax("lib.py", {"GNU.sparse.size": "nan"})],
        "the header of the first member cannot be read: invalid literal for int() with base "
        "10: 'nan'",
    ),
    "a pax header of 8 MiB of zeros": (
        "pax_bomb",
        f"is an extended header of {8 * MB} bytes, more than the "
        f"{MAX_HEADER_BYTES} any real archive needs",
    ),
}


def pax_bomb(target):
    """An extended header declaring 8 MiB (zeros: about 8 KB compressed), which tarfile would
    read into memory whole, then a file."""
    header = tarfile.TarInfo("PaxHeaders/bomb")
    header.type, header.size = tarfile.XHDTYPE, 8 * MB
    with tarfile.open(target, "w:gz", format=tarfile.USTAR_FORMAT) as tar:
        tar.fileobj.write(header.tobuf(tarfile.USTAR_FORMAT))
        shutil.copyfileobj(zeros(8 * MB), tar.fileobj)
        tar.offset += tarfile.BLOCKSIZE + 8 * MB
        tar.addfile(*file_member("train.py", data=b"#"))
    return target


def test_an_archive_of_too_many_members_is_refused_at_the_first_past_the_limit(tmp_path):
    """Empty files cost nothing against the byte limit; the member count stops them, and the
    member past it is not written."""
    archive = archive_of(
        tmp_path / "many.tar.gz", *(file_member(f"empty-{index:03}") for index in range(6))
    )
    (tmp_path / "staging").mkdir()
    with pytest.raises(untar.RefusedMember, match="'empty-005' is past the limit of 5 members"):
        untar.extract(archive, tmp_path / "staging", MB, max_members=5)
    assert sorted(path.name for path in (tmp_path / "staging").iterdir()) == [
        f"empty-{index:03}" for index in range(5)
    ]


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_field_is_refused_naming_the_member(tmp_path, case):
    members, reason = HOSTILE[case]
    archive = tmp_path / "hostile.tar.gz"
    pax_bomb(archive) if members == "pax_bomb" else archive_of(archive, *members)
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(ConfigError) as refused:
        extract(archive, staging, URI)
    message = str(refused.value)
    assert message.startswith(f"submit directory {URI!r} cannot be unpacked: "), message
    assert reason in message, message
    assert os.listdir(staging) == []


def test_a_nul_byte_in_a_path_stops_the_launcher_with_exit_code_2(make_job, tmp_path):
    """It was exit code 1, "internal error", with a traceback."""
    archive = archive_of(
        tmp_path / "nul.tar.gz",
        file_member("train.py", data=SCRIPT.encode()),
        pax("plain.py", {"path": "lib/evil\x00.py"}),
    )
    root = job(make_job, str(archive))
    before = a_code_folder(root)
    expect_config_error(root, "member 'lib/evil\\x00.py' has a NUL byte in its name")
    assert_left_as_it_was(root, before)


def test_the_limit_is_a_documented_hyperparameter_with_a_range(make_job, tmp_path):
    root = job(make_job, str(tmp_path / "none.tar.gz"), submit_directory_max_mb="-1")
    result = dry_run(root)
    assert result.returncode == 2 and "submit_directory_max_mb='-1' is invalid" in result.stderr
