"""The zip door: ``class/file`` members like a tar (stored, deflate, bzip2 and lzma), listed from the
central directory; workers inflate and CRC-check each member by offset."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path
from typing import Callable

from ..errors import SourceError
from .archive_listing import DEFAULT_MAX_MEMBER_SIZE, MAX_EXPANSION, _Listing, _member_name
from .listing import SourceListing
from .members import ZIP_METHODS
from .tar import _name_meta

# --- zip --------------------------------------------------------------------------------------------------

def list_zip(path: Path, *, progress: Callable[[int], None] | None = None,
             max_member_size: int = DEFAULT_MAX_MEMBER_SIZE) -> SourceListing:
    """List a zip of ``class/file`` members (see the module docstring).

    Raises:
        SourceError: not a zip, or a damaged central directory.
    """
    out = _Listing(progress)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise SourceError(f"not a readable zip archive: {exc}", path=path) from None
    container = out.add_container(str(path.resolve()))
    with archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            name = _member_name(info.filename, out)
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
            if info.file_size > max_member_size:
                out.reject(name, "oversize-member", f"{info.file_size} bytes, over the limit of {max_member_size}")
                continue
            if info.file_size > (1 << 20) and info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
                out.reject(name, "decompression-bomb", f"{info.compress_size} compressed bytes declare "
                                                      f"{info.file_size} bytes (over {MAX_EXPANSION}x)")
                continue
            if "/" not in name:
                out.reject(name, "not-in-class-folder", "members must sit inside a class folder (class/file)")
                continue
            out.add(name, info.file_size, out.class_id(name.split("/", 1)[0]), container, info.header_offset,
                    info.compress_size, method, info.CRC, meta=_name_meta(info.filename))
    return out.finish(path, "zip")
