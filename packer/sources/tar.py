"""The tar door (plain, gz, bz2, xz, zstd): ``class/file`` members as in an image folder, or a tar
of class tars (ImageNet's ``ILSVRC2012_img_train.tar``: one class per inner tar, named after it
without the extension). Keys are ``class/file`` in both cases; a file at the top level is
``not-in-class-folder``.

**Every part is listed.** Tars stored one after another (``cat a.tar b.tar``, or a ``.tar.gz``
of several gzip members) are one source: after each end-of-archive marker the rest of the file
is read, and a further tar header starts the next part (zero blocks between parts are padding).
Anything else after a marker is damage, and a ``SourceError``: a part is never dropped quietly.

**Parallelism.** An uncompressed tar is listed by reading only headers (tarfile seeks past member
data), and workers then read members by offset in parallel (``members.MemberReader``). A
compressed tar is decompressed once, while listing, in one sequential pass that writes the
uncompressed stream to a spool file in the output's staging folder (``spool_dir``); packing then
reads the spool by offset in parallel. The cost is the decompressor's speed plus the spool's disk
space (removed with the staging folder when the build commits, or when the build fails). A
compressed stream expanding more than ``MAX_EXPANSION`` times past 1 GiB is refused as a
decompression bomb (``SourceError``).

A member of a class tar is listed with the outer member's byte range as its bounds, so a header
that lies about a size is caught by the source contract instead of packing the bytes of the
members after it.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import IO

from .archive_listing import ArchiveListing, member_name, name_meta, not_a_file
from .listing import DoorOptions, RawListing
from .sniff import is_tar_header
from .tar_stream import BLOCK, ChainedMember, SpooledTar, all_file_members, archive_errors, tar_members


def list_tar(path: Path, door: DoorOptions = DoorOptions()) -> RawListing:
    """List a tar of ``class/file`` members, of class tars, or both (see the module docstring).

    Raises:
        SourceError: not a tar, a damaged archive, a decompression bomb.
        BuildError: the disk filled while decompressing into the spool.
    """
    with archive_errors(path):
        return _list_tar(path, door)


def _list_tar(path: Path, door: DoorOptions) -> RawListing:
    out = ArchiveListing(door.progress)
    opened = SpooledTar(path, door.spool_dir, out, 0)
    for archive, seekable, name, member in all_file_members(opened, out):
        handle = archive.extractfile(member)
        head = handle.read(BLOCK) if handle is not None and member.size >= 2 * BLOCK else b""
        if is_tar_header(head):
            if seekable:  # the inner tar's headers alone are read
                handle.seek(0)  # type: ignore[union-attr]
                inner: IO[bytes] = handle  # type: ignore[assignment]
            else:  # one pass through the spooling stream, the head already read
                inner = io.BufferedReader(ChainedMember(head, handle), 1 << 16)  # type: ignore[arg-type]
            _list_inner_tar(inner, member, name, out, opened.container, seekable=seekable)
            continue
        if "/" not in name:
            out.reject(name, "not-in-class-folder", "members must sit inside a class folder (class/file), "
                                                     "or in a class tar")
            continue
        out.add(name, member.size, out.name_label(name.split("/", 1)[0]), opened.container, member.offset_data,
                member.size, meta=name_meta(member.name))
    return out.finish(path, "tar")


def _list_inner_tar(handle: IO[bytes], member: tarfile.TarInfo, name: str, out: ArchiveListing, container: int, *,
                    seekable: bool) -> None:
    """One member tar is one class: its name without the extension. Its members must stay inside
    the outer member's bytes (a region the contract checks)."""
    class_name = name.rsplit("/", 1)[-1]
    class_name = class_name.split(".", 1)[0] or class_name
    label = out.name_label(class_name)
    base = member.offset_data
    region = out.add_region(container, base, base + member.size)
    try:
        with tarfile.open(fileobj=handle, mode="r:" if seekable else "r|") as inner:
            for item in tar_members(inner):
                if item.isdir():
                    continue
                inner_name = member_name(item.name, out)
                if inner_name is None:
                    continue
                key = f"{class_name}/{inner_name}"
                problem = not_a_file(item)
                if problem is not None:
                    out.reject(key, "not-a-file", problem)
                else:
                    out.add(key, item.size, label, container, base + item.offset_data, item.size,
                            meta=name_meta(item.name), region=region)
    except (tarfile.TarError, ValueError, OverflowError, UnicodeError, EOFError) as exc:
        out.reject(name, "unreadable", f"the class tar is damaged or truncated: {exc}")
