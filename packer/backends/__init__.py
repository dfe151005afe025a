"""Byte movement: backends that read ranges of one shard file, behind one small protocol.

Every backend implements ``read_into(offset, out)``, plus ``view(offset, size)`` where zero-copy
is possible. Datasets and adapters consume a backend and parse nothing; the shard header was
validated when the shard was opened (see ``packer.dataset``).

- ``posix``: ``mmap`` (zero-copy, shared page cache) and ``pread``;
- ``direct``: ``O_DIRECT`` reads through one checked choke point;
- ``kvikio``: GPUDirect Storage reads into device memory (kvikio imported lazily);
- ``runs``: coalescing a batch of samples into one aligned read per run of consecutive samples;
- ``buffers``: aligned host allocations and buffer addresses;
- ``readahead``: the background thread that prepares the next batch (used by ``packer.gpu``).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..errors import OptionError

__all__ = ["ShardBackend", "BACKEND_NAMES", "check_backend_name", "open_backend"]

#: Every backend name ``open_dataset(backend=...)`` accepts.
BACKEND_NAMES = ("mmap", "pread", "direct", "kvikio")


class ShardBackend(Protocol):
    """Reads byte ranges of one open shard file."""

    path: str
    size: int

    def read_into(self, offset: int, out: Any) -> None:
        """Fill the writable buffer ``out`` with the bytes at ``offset`` (exactly len(out) bytes)."""

    def view(self, offset: int, size: int) -> memoryview:
        """The bytes at ``offset``: zero-copy when the backend can (mmap), else a fresh buffer."""

    def close(self) -> None: ...


def check_backend_name(name: object) -> str:
    """Return ``name`` if it is a backend; checked before anything is opened or mapped.

    Raises:
        OptionError: not one of ``BACKEND_NAMES``.
    """
    if name not in BACKEND_NAMES:
        raise OptionError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    return str(name)


def open_backend(name: str, fd: int, path: str, size: int) -> ShardBackend:
    """Open backend ``name`` over an already validated shard file descriptor.

    Raises:
        OptionError: an unknown backend name.
        MissingDependencyError: the kvikio backend without kvikio or a CUDA driver.
    """
    check_backend_name(name)
    if name == "mmap":
        from .posix import MmapShard
        return MmapShard(fd, path, size)
    if name == "pread":
        from .posix import PreadShard
        return PreadShard(fd, path, size)
    if name == "direct":
        from .direct import DirectShard
        return DirectShard(fd, path, size)
    from .kvikio import KvikioShard  # GPUDirect Storage: imports kvikio lazily, says what is missing
    return KvikioShard(fd, path, size)
