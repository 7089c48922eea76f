"""Unpacking an untrusted tar archive with what Python's `data` extraction filter (PEP 706)
allows, on every Python: the image's is Debian 12's 3.11.2, whose tarfile has no `filter=`, so
this module writes the members itself and never calls tarfile's extract.

Checking the member list before extraction is not enough: links that earlier members leave
on disk change where later names lead (`l1 -> .`, `l2 -> l1/..`, then `l2/x` is written into
the folder's parent). So each member is checked just before it is written, against the disk as
the members before it left it:

- its name is relative, and where it lands, with every link on disk along the way followed,
  is inside the destination. A file or link is then created there without following anything:
  an existing file or link of its name is replaced, never written through, and a folder of its
  name is refused. A folder is made unless one (or a link to one inside) is already there;
- a symbolic link's target (from the link's folder) and a hard link's (from the destination,
  as tar names it) are relative and inside the destination; a hard link's must be a file
  unpacked before it;
- only files, folders and links: devices and FIFOs are refused;
- permissions as `data` sets them: no setuid, setgid or sticky bit, no group or other write,
  owner read and write, execute bits kept only when the owner has one; folders get the default
  mode; the owner is whoever unpacks.

The archive is bounded too, since its size says nothing of what it unpacks to (gzip packs
zeros about 1000:1, and a sparse member of 125 bytes in the archive can declare 20 GiB): each
file's declared size is counted before anything of it is written, and the member that would
take the files past `max_bytes` is refused, as is an extended header (pax, or GNU long name)
larger than MAX_HEADER_BYTES, which tarfile would read whole into memory, and the member past
MAX_MEMBERS (a million empty files pass any byte limit). A member whose name
or link holds a NUL byte, or whose time is not a number (a pax `mtime=nan`), is refused before
it is written, naming it.

When every member is on disk, every symbolic link is followed once more: a link whose target
did not exist yet when it was made may lead out through links made after it, and the code run
from the folder would follow it there.

Links are followed here, one name at a time, not by os.path.realpath: realpath answers with the
rest of a path unresolved once a name gets too long, which is how archives got past the `data`
filter itself (CPython gh-135034). Here any error but a name that does not exist yet refuses
the member.
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, cast

MAX_LINKS = 40  # as many links as the kernel follows in one path before ELOOP
# An extended header (pax, GNU long name or link) is read into memory whole; any real one is a
# few hundred bytes, PATH_MAX is 4096.
MAX_HEADER_BYTES = 1024 * 1024
# Members in one archive: tarfile keeps every member's header in memory, and empty files cost
# no bytes against max_bytes but an inode and a write each; a code folder has far fewer.
MAX_MEMBERS = 100_000

SPECIAL_KINDS = {
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
}


class RefusedMember(Exception):
    """A member the archive may not unpack: its name and why, in words for the user."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"member {name!r} {reason}")
        self.name, self.reason = name, reason


class UnreadableHeader(RefusedMember):
    """A header tarfile cannot read: a pax number that is not one (`GNU.sparse.size=nan`)
    makes it raise ValueError, not a TarError."""

    def __init__(self, previous: str | None, error: Exception):
        where = "of the first member" if previous is None else f"after member {previous!r}"
        Exception.__init__(self, f"the header {where} cannot be read: {error}")
        self.name, self.reason = previous or "", str(error)


class TooLarge(RefusedMember):
    """A member that would take the unpacked files past the limit on their size."""


class BoundedHeaders(tarfile.TarInfo):
    """tarfile's member, refusing an extended header larger than MAX_HEADER_BYTES before
    tarfile reads it into memory (a pax header can declare gigabytes of zeros)."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in EXTENDED_HEADERS and self.size > MAX_HEADER_BYTES:
            raise TooLarge(
                self.name,
                f"is an extended header of {self.size} bytes, more than "
                f"the {MAX_HEADER_BYTES} any real archive needs",
            )
        # tarfile's own hook for reading a member's header, private and so not in typeshed
        member: tarfile.TarInfo = super()._proc_member(tar)  # type: ignore[misc]
        return member


EXTENDED_HEADERS = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)


def open_archive(archive: Path) -> tarfile.TarFile:
    """`archive` opened for reading, its extended headers bounded (BoundedHeaders); raises
    tarfile.ReadError when it is not a tar archive (plain or compressed)."""
    try:
        return tarfile.open(archive, tarinfo=BoundedHeaders)
    except (ValueError, OverflowError) as error:
        raise UnreadableHeader(None, error) from None


def members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The archive's members in order, each read as it is reached."""
    previous = None
    while True:
        try:
            member = tar.next()
        except (ValueError, OverflowError) as error:
            raise UnreadableHeader(previous, error) from None
        if member is None:
            return
        previous = member.name
        yield member


def extract(
    archive: Path, destination: Path, max_bytes: int, max_members: int = MAX_MEMBERS
) -> None:
    """Unpack `archive` into the existing folder `destination`, member by member, its files
    at most `max_bytes` in all and at most `max_members` members; raises RefusedMember at the
    first member that breaks the rules above (what came before it stays on disk: the caller
    unpacks into a folder of its own and removes it)."""
    root = os.path.realpath(destination)
    links = []
    written = 0
    with open_archive(archive) as tar:
        for count, member in enumerate(members(tar), start=1):
            if count > max_members:
                raise RefusedMember(
                    member.name,
                    f"is past the limit of {max_members} members in one archive; "
                    "source_dir holds code: give data as an input channel",
                )
            check_fields(member)
            if member.isreg():
                written += member.size
                if written > max_bytes:
                    raise TooLarge(
                        member.name,
                        f"is {member.size} bytes unpacked, which takes "
                        f"the archive's files past the limit of {max_bytes} bytes",
                    )
            try:
                path = place(tar, member, root)
            except (OSError, OverflowError, ValueError) as error:  # Overflow: time_t range
                raise RefusedMember(
                    member.name,
                    f"cannot be followed or written: {getattr(error, 'strerror', None) or error}",
                ) from None
            if member.issym():
                links.append((member.name, path))
    for name, path in links:
        try:
            target = resolve(root, os.path.relpath(path, root))
        except OSError as error:
            raise RefusedMember(name, f"cannot be followed: {error.strerror}") from None
        if not inside(target, root):
            raise RefusedMember(
                name,
                "is a symbolic link that leads outside the folder, to "
                f"{shown(target, root)}, once the members after it are unpacked",
            )


def check_fields(member: tarfile.TarInfo) -> None:
    """Refuse the fields no file system takes, which a pax header can carry: a NUL byte in
    the name or link (the kernel's names end at one) or a time that is not a number."""
    for field, value in (("name", member.name), ("link target", member.linkname)):
        if "\0" in value:
            raise RefusedMember(
                member.name, f"has a NUL byte in its {field}; names and links cannot hold one"
            )
    if isinstance(member.mtime, float) and not math.isfinite(member.mtime):
        raise RefusedMember(
            member.name, f"has the modification time {member.mtime!r}, which is not a time"
        )


def place(tar: tarfile.TarFile, member: tarfile.TarInfo, root: str) -> str:
    """Check one member against the disk and write it under `root`; returns its path."""
    name = member.name
    if name.startswith("/"):
        raise RefusedMember(
            name, "has an absolute name; name members relative to the archive's folder"
        )
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        kind = SPECIAL_KINDS.get(member.type, f"member of tar type {member.type!r}")
        raise RefusedMember(name, f"is a {kind}; only files, folders and links can be unpacked")
    if member.isdir():
        path = resolve(root, name)
        refuse_outside(name, path, root)
        if os.path.lexists(path) and not os.path.isdir(path):
            raise RefusedMember(
                name, "is a folder where a file of that name was unpacked before it"
            )
        os.makedirs(path, exist_ok=True)
        return path
    parent, _, base = name.rstrip("/").rpartition("/")
    if base in ("", ".", ".."):
        raise RefusedMember(name, "is not a folder but has a folder's name")
    folder = resolve(root, parent)
    path = os.path.join(folder, base)
    refuse_outside(name, path, root)
    source = link_source(member, folder, root)
    os.makedirs(folder, exist_ok=True)
    if os.path.isdir(path) and not os.path.islink(path):
        raise RefusedMember(name, "would replace the folder of that name unpacked before it")
    if os.path.lexists(path):
        os.unlink(path)
    if member.issym():
        os.symlink(member.linkname, path)
    elif member.islnk() and source is not None:  # link_source: where a hard link leads
        os.link(source, path, follow_symlinks=False)
    else:
        write_file(tar, member, path)
    return path


def link_source(member: tarfile.TarInfo, folder: str, root: str) -> str | None:
    """Where a link member leads (a symbolic link from its folder, a hard link from the
    destination), refused when absolute or outside; None for other members."""
    if not (member.issym() or member.islnk()):
        return None
    kind = "symbolic" if member.issym() else "hard"
    if member.linkname.startswith("/"):
        raise RefusedMember(
            member.name,
            f"is a {kind} link to the absolute path "
            f"{member.linkname!r}; links must be relative and stay inside",
        )
    source = resolve(folder if member.issym() else root, member.linkname)
    if not inside(source, root):
        raise RefusedMember(
            member.name,
            f"is a {kind} link to {member.linkname!r}, which "
            f"leads outside the folder, to {shown(source, root)}",
        )
    if member.islnk() and not os.path.isfile(source):
        raise RefusedMember(
            member.name,
            f"is a hard link to {member.linkname!r}, which is not a file unpacked before it",
        )
    return source


def write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> None:
    """A new regular file at `path` (never through a link), with the `data` filter's mode."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    # only regular members are written, and tarfile gives their content, never None
    content_file = cast(IO[bytes], tar.extractfile(member))
    with os.fdopen(descriptor, "wb") as target, content_file as content:
        shutil.copyfileobj(content, target)
        os.fchmod(descriptor, data_mode(member.mode))
        os.utime(descriptor, (member.mtime, member.mtime))


def data_mode(mode: int) -> int:
    """A file's mode as the `data` filter sets it: no setuid, setgid, sticky bit or group and
    other write; read and write for the owner; execute for all only if the owner had it."""
    mode &= 0o755
    if not mode & stat.S_IXUSR:
        mode &= ~0o111
    return mode | stat.S_IRUSR | stat.S_IWUSR


def resolve(start: str, relative: str) -> str:
    """`start` joined with `relative`, every symbolic link on disk along the way followed as
    the kernel would. A name that does not exist (yet) is taken as it is, so the answer is
    where a write would land. Raises OSError where the kernel would fail to follow (a loop, a
    name too long, a file used as a folder) instead of answering with a half-resolved path."""
    path = start
    pending = relative.split("/")[::-1]
    followed = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            path = os.path.dirname(path)
            continue
        candidate = os.path.join(path, part)
        if not is_link(candidate):
            path = candidate
            continue
        followed += 1
        if followed > MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), candidate)
        target = os.readlink(candidate)
        if target.startswith("/"):
            path = "/"
        pending.extend(target.split("/")[::-1])
    return path


def is_link(path: str) -> bool:
    """Whether `path` is a symbolic link; False when it does not exist, OSError otherwise."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def refuse_outside(name: str, path: str, root: str) -> None:
    if not inside(path, root):
        raise RefusedMember(name, f"would land outside the folder, at {shown(path, root)}")


def shown(path: str, root: str) -> str:
    """Where a path leads, relative to the folder (`../x`), for messages."""
    return os.path.relpath(path, root)
