"""The ``tar`` export target: one uncompressed PAX tar, members in dataset order, deterministic bytes.

Every member has mtime 0, uid/gid 0, no user or group name and mode 0644, so the same dataset
and options give the same tar. Names that are not UTF-8 keep their bytes (PAX ``hdrcharset``).
"""

from __future__ import annotations

import io
import os
import tarfile
from typing import Any, BinaryIO

import numpy as np

from .plan import SampleNamer, SampleEntries
from . import safewrite
from .safewrite import StagedOutput

__all__ = ["write_tar", "tar_member", "write_members"]


def tar_member(name: bytes, size: int) -> tarfile.TarInfo:
    """The header of a regular-file member ``name`` of ``size`` bytes (module docstring)."""
    info = tarfile.TarInfo(os.fsdecode(name))
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o644, 0, 0
    info.uname = info.gname = ""
    return info


def open_tar(handle: BinaryIO) -> tarfile.TarFile:
    return tarfile.open(fileobj=handle, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8",
                        errors="surrogateescape")


def write_members(archive: tarfile.TarFile, namer: SampleNamer, sample: SampleEntries) -> None:
    """Sample ``sample``'s entries as consecutive members of ``archive``."""
    for entry in sample.entries:
        body = namer.body(sample, entry)
        archive.addfile(tar_member(entry.name, len(body)), io.BytesIO(body))
    safewrite.checkpoint("file-written")


def write_tar(namer: SampleNamer, rows: np.ndarray, staged: StagedOutput, result: Any, per_shard: int) -> None:
    """Write samples ``rows`` as one tar into the file stage."""
    with open_tar(staged.open_file()) as archive:
        for sample in namer.planned(rows):
            write_members(archive, namer, sample)
            result.count(namer, sample)
    result.files = 1
