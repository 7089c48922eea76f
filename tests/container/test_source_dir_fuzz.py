"""Property: whatever archive the submit directory is, unpacking it ends either with its files
in the staging folder or in a ConfigError (exit code 2) that names the URI; never another
exception (the launcher's exit code 1, "internal error"), and never a write outside the
staging folder. The archives are made by tarfile from fuzzed members (names, kinds, links,
modes, times, pax fields) and by flipping bytes of a valid one, then unpacked by the real
extraction path (container.source_dir.extract) against a 1 MiB limit."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import tempfile
from pathlib import Path

from hypothesis import strategies as st

from container.source_dir import extract
from job.errors import ConfigError
from tests.fuzzing import fuzz

URI = "s3://sm11-jobs/fuzzed.tar.gz"
KINDS = [
    tarfile.REGTYPE,
    tarfile.REGTYPE,
    tarfile.DIRTYPE,
    tarfile.SYMTYPE,
    tarfile.LNKTYPE,
    tarfile.FIFOTYPE,
    tarfile.CHRTYPE,
    b"7",
    b"Z",
]

# Names from parts that mean something to a path: folders, links, parents, NUL, non-ASCII.
name_parts = st.sampled_from(
    ["a", "b", "lib", ".", "..", "", "x.py", "\x00", "\u00e9", "d" * 120, "..."]
)
names = st.lists(name_parts, min_size=1, max_size=5).map("/".join) | st.text(max_size=20)
pax_fields = st.dictionaries(
    st.sampled_from(
        [
            "path",
            "linkpath",
            "mtime",
            "size",
            "uid",
            "gid",
            "uname",
            "atime",
            "GNU.sparse.size",
            "GNU.sparse.realsize",
            "comment",
        ]
    ),
    st.one_of(
        st.sampled_from(
            [
                "nan",
                "inf",
                "-inf",
                "-1",
                "1e400",
                "99999999999999999999",
                "\u0661\u0662",
                "0x10",
                "",
            ]
        ),
        names,
    ),
    max_size=3,
)
members = st.tuples(
    names, st.sampled_from(KINDS), names, st.integers(0, 0o7777), st.integers(0, 2048), pax_fields
)


def archive(entries, format) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=format) as tar:
        for name, kind, linkname, mode, size, headers in entries:
            member = tarfile.TarInfo(name)
            member.type, member.linkname, member.mode = kind, linkname, mode
            member.pax_headers = headers if format == tarfile.PAX_FORMAT else {}
            member.size = size if kind == tarfile.REGTYPE else 0
            try:
                tar.addfile(member, io.BytesIO(bytes(member.size)))
            except (ValueError, tarfile.TarError, UnicodeError):
                pass  # tarfile will not write it: not an archive to try
    return buffer.getvalue()


built = st.builds(
    archive,
    st.lists(members, max_size=6),
    st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]),
)


def flip(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    mutable = bytearray(data)
    for position, value in flips:
        if mutable:
            mutable[position % len(mutable)] = value
    return bytes(mutable)


mutated = st.builds(
    flip,
    built,
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
)
truncated = st.builds(lambda data, keep: data[:keep], built, st.integers(0, 4096))
archives = st.tuples(st.one_of(built, mutated, truncated), st.booleans()).map(
    lambda pair: gzip.compress(pair[0], mtime=0) if pair[1] else pair[0]
)


@fuzz("source_dir archives", max_examples=250, data=archives)
def test_any_archive_is_unpacked_or_refused_with_a_config_error(data):
    with tempfile.TemporaryDirectory() as sandbox:
        root = Path(sandbox)
        (root / "outside.txt").write_text("kept")
        staging = root / "a" / "b" / "staging"
        staging.mkdir(parents=True)
        (root / "archive.tar.gz").write_bytes(data)
        try:
            extract(root / "archive.tar.gz", staging, URI, max_mb=1)
        except ConfigError as error:
            assert str(error).startswith(f"submit directory {URI!r} "), error
        outside = {
            os.path.relpath(os.path.join(folder, name), root)
            for folder, folders, files in os.walk(root)
            for name in folders + files
        }
        outside = {path for path in outside if not path.startswith("a/b/staging")}
        assert outside == {"outside.txt", "archive.tar.gz", "a", "a/b"}, outside
        assert (root / "outside.txt").read_text() == "kept"
