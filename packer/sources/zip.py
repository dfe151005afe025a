"""The zip door: ``class/file`` members like a tar (stored, deflate, bzip2 and lzma), listed from the
central directory; workers inflate and CRC-check each member by offset.

The central directory is a list of claims: where each member starts, how many bytes it stores
and how many it expands to. The door lists them as claimed; the source contract checks every
claim against the archive (each member inside it, no two overlapping, no member expanding more
than ``MAX_EXPANSION`` times, the total bounded by the archive's size), so an entry declaring a
terabyte, or thousands of entries sharing one compressed kernel, never reach a worker.
"""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

from ..errors import SourceError
from .archive_listing import ArchiveListing, member_name, name_meta
from .listing import DoorOptions, RawListing
from .members import ZIP_METHODS

_LIMIT = 1 << 63  # offsets and sizes past this are no file's


def list_zip(path: Path, door: DoorOptions = DoorOptions()) -> RawListing:
    """List a zip of ``class/file`` members (see the module docstring).

    Raises:
        SourceError: not a zip, or a damaged central directory.
    """
    out = ArchiveListing(door.progress)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise SourceError(f"not a readable zip archive: {exc}", path=path) from None
    container = out.add_container(str(path.resolve()))
    with archive:
        for info in archive.infolist():
            if not info.filename:
                out.reject("(empty name)", "bad-manifest-row", "a zip member with an empty name")
                continue
            if info.is_dir():
                continue
            name = member_name(info.filename, out)
            if name is None:
                continue
            mode = info.external_attr >> 16
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # writers that store no type leave 0
                out.reject(name, "not-a-file", "a symbolic link or special file stored in the zip")
                continue
            if info.flag_bits & 1:
                out.reject(name, "unreadable", "an encrypted zip member")
                continue
            method = ZIP_METHODS.get(info.compress_type)
            if method is None:
                out.reject(name, "unreadable", f"zip compression method {info.compress_type} is not supported")
                continue
            if not all(0 <= value < _LIMIT for value in (info.header_offset, info.compress_size, info.file_size)):
                out.reject(name, "unreadable", f"the central directory gives impossible numbers (offset "
                                               f"{info.header_offset}, {info.compress_size} bytes stored, "
                                               f"{info.file_size} expanded): a damaged or crafted archive")
                continue
            if "/" not in name:
                out.reject(name, "not-in-class-folder", "members must sit inside a class folder (class/file)")
                continue
            out.add(name, info.file_size, out.name_label(name.split("/", 1)[0]), container, info.header_offset,
                    info.compress_size, method, info.CRC, meta=name_meta(info.filename))
    return out.finish(path, "zip")
