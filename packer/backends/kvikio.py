"""The kvikio backend: shard reads straight into GPU memory through cuFile (GPUDirect Storage or
kvikio's compatibility mode), plus what the machine offers for it (driver, GDS mode, threads).

Nothing here imports kvikio at module import; ``KvikioShard`` imports it when created and says
which extra to install when it is missing (``pip install 'packer-shards[gpu]'``). Host buffers and
``view`` use plain ``pread``.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable

from ..errors import (DatasetChangedError, GpuPathError, MissingDependencyError, OffsetOutOfBoundsError, OptionError,
                      TruncatedFileError)
from .posix import PreadShard

__all__ = ["DEFAULT_TASK_SIZE", "GPU_EXTRA", "KvikioShard", "gds_status", "cuda_driver_status", "set_kvikio_threads",
           "import_kvikio", "kvikio_get", "is_cuda_buffer", "cuda_nbytes", "host_view"]

#: Bytes per kvikio task: large enough for full NVMe/GDS bandwidth, small enough to spread over threads.
DEFAULT_TASK_SIZE = 8 << 20

GPU_EXTRA = "pip install 'packer-shards[gpu]'"


# --- environment -------------------------------------------------------------------------------

def import_kvikio() -> Any:
    """Import kvikio, or raise ``MissingDependencyError`` naming the extra."""
    try:
        import kvikio
        import kvikio.defaults  # noqa: F401  (older versions do not import it eagerly)
    except Exception as exc:  # noqa: BLE001 - ImportError, OSError or RuntimeError when a .so is missing
        raise MissingDependencyError(
            f"the kvikio backend needs kvikio (GPUDirect Storage reads), which cannot be imported "
            f"({exc}); install it with {GPU_EXTRA}") from None
    return kvikio


def cuda_driver_status() -> tuple[bool, str]:
    """Whether an NVIDIA driver with at least one GPU is usable, and a one-line explanation.

    Asks the driver API directly (``libcuda.so.1``: ``cuInit``, ``cuDeviceGetCount``) rather than
    a framework, so it works without torch or CuPy. This initialises CUDA in the calling
    process: call it where the GPU will be used (not in a parent that forks workers later).
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return False, f"no NVIDIA driver: libcuda.so.1 cannot be loaded ({exc})"
    rc = lib.cuInit(0)
    if rc != 0:
        return False, f"the NVIDIA driver is installed but cuInit failed (CUDA error {rc}: no usable GPU?)"
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0 or count.value < 1:
        return False, "the NVIDIA driver sees no GPU"
    return True, f"{count.value} GPU(s) visible"


def _require_cuda_driver(what: str, path: object = None) -> None:
    ok, why = cuda_driver_status()
    if not ok:
        raise MissingDependencyError(f"{what} needs an NVIDIA GPU and its driver ({why}); read with "
                                     f"backend='pread' (or 'direct') on machines without one", path=path)


def kvikio_get(kvikio: Any, name: str) -> Any:
    """A kvikio setting across versions: ``defaults.get(name)`` (25.x+) or ``defaults.<name>()`` (older)."""
    defaults = kvikio.defaults
    getter = getattr(defaults, "get", None)
    if callable(getter):
        try:
            return getter(name)
        except (KeyError, ValueError, AttributeError, TypeError):
            pass
    legacy = getattr(defaults, name, None)
    return legacy() if callable(legacy) else None


def set_kvikio_threads(num_threads: int) -> None:
    """Size kvikio's I/O thread pool (``defaults.set("num_threads", n)``, or ``num_threads_reset`` before 25.x)."""
    kvikio = import_kvikio()
    defaults = kvikio.defaults
    setter = getattr(defaults, "set", None)
    if callable(setter):
        try:
            setter("num_threads", int(num_threads))  # applies globally; the returned manager is optional
            return
        except (KeyError, ValueError, TypeError):
            pass
    reset = getattr(defaults, "num_threads_reset", None)
    if callable(reset):
        reset(int(num_threads))


def _mode_name(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):  # kvikio < 24.12 returned a bool
        return "ON" if value else "OFF"
    name = getattr(value, "name", None)
    return str(name if name is not None else value).upper()


def gds_status() -> dict[str, Any]:
    """What is *known* here about kvikio and GPUDirect Storage, without a read (JSON-ready).

    Two things are known before any read: the mode kvikio was asked for, and what the machine
    offers. Whether a given file's reads then go through GDS is decided per file, at open or at
    the first cuFile call (under ``AUTO`` kvikio falls back to its POSIX path for a file whose
    cuFile open or ``O_DIRECT`` open fails, and cuFile can run its own compatibility mode), and
    packer cannot observe that decision. So this never says GDS *is* active: ``gds_possible``
    is the most it claims, and only a measurement (``scripts/gpu_check.py``: kvikio reads into
    device memory vs ``pread`` + copy in the same run) tells what a file really got.

    Keys:
        kvikio, kvikio_version, error: importable, its version, why not (else None).
        cuda_driver, cuda: the driver check and its explanation.
        requested_mode: the compatibility mode kvikio was asked for (``"ON"``, ``"OFF"``,
            ``"AUTO"``; ``KVIKIO_COMPAT_MODE`` or ``kvikio.defaults.set``), or None.
        compat_mode: the same value (kept for older callers).
        compat_mode_preferred: kvikio's machine-wide guess that it will use its POSIX path
            (True: no GDS for any file; False: cuFile will be *tried*), or None.
        gds_available: the cuFile driver reports GDS support on this machine, or None.
        gds_possible: driver, cuFile GDS support and a mode that tries cuFile: GDS *can* run
            here; a file may still fall back (see above).
        gds_verified: always False here: nothing was measured (kept so that no caller reads
            a missing key as "yes").
        num_threads, task_size: kvikio's thread pool and task size.
    """
    status: dict[str, Any] = {"kvikio": False, "kvikio_version": None, "error": None, "cuda_driver": False,
                              "cuda": None, "requested_mode": None, "compat_mode": None,
                              "compat_mode_preferred": None, "gds_available": None, "gds_possible": False,
                              "gds_verified": False, "num_threads": None, "task_size": None}
    try:
        kvikio = import_kvikio()
    except MissingDependencyError as exc:
        status["error"] = exc.message
        return status
    status["kvikio"] = True
    status["kvikio_version"] = getattr(kvikio, "__version__", None)
    status["cuda_driver"], status["cuda"] = cuda_driver_status()
    try:
        status["requested_mode"] = status["compat_mode"] = _mode_name(kvikio_get(kvikio, "compat_mode"))
        status["num_threads"] = kvikio_get(kvikio, "num_threads")
        status["task_size"] = kvikio_get(kvikio, "task_size")
        preferred = getattr(kvikio.defaults, "is_compat_mode_preferred", None)
        status["compat_mode_preferred"] = (bool(preferred()) if callable(preferred)
                                           else status["requested_mode"] == "ON")
    except Exception as exc:  # noqa: BLE001 - a status report must not fail on a kvikio quirk
        status["error"] = f"kvikio settings unreadable: {exc}"
    if status["cuda_driver"]:
        try:
            import kvikio.cufile_driver as driver
            getter = getattr(driver, "get", None)
            if callable(getter):
                status["gds_available"] = bool(getter("is_gds_available"))
            else:  # before 25.x
                status["gds_available"] = bool(driver.DriverProperties().is_gds_available)
        except Exception as exc:  # noqa: BLE001 - no libcufile is a normal answer: GDS unavailable
            status["gds_available"] = False
            status["error"] = status["error"] or f"cuFile driver unavailable: {exc}"
    status["gds_possible"] = bool(status["cuda_driver"] and status["gds_available"]
                                  and status["requested_mode"] in ("OFF", "AUTO")
                                  and status["compat_mode_preferred"] is False)
    return status


# --- the backend -------------------------------------------------------------------------------

def cuda_nbytes(out: Any) -> int:
    """Byte length of a C-contiguous CUDA array described by ``__cuda_array_interface__``."""
    cai = out.__cuda_array_interface__
    count = 1
    for extent in cai["shape"]:
        count *= int(extent)
    itemsize = int(cai["typestr"][2:])
    strides = cai.get("strides")
    if strides is not None and count > 1:
        expected, step = [], itemsize
        for extent in reversed(cai["shape"]):
            expected.append(step)
            step *= int(extent)
        if any(int(extent) > 1 and int(s) != e
               for extent, s, e in zip(cai["shape"], strides, reversed(expected))):
            raise OptionError("read_into needs a C-contiguous CUDA buffer")
    return count * itemsize


def host_view(out: Any) -> Any:
    """A writable buffer-protocol view of a host buffer (torch CPU tensors have none: use ``.numpy()``)."""
    try:
        memoryview(out)
    except TypeError:
        if hasattr(out, "numpy"):
            return out.numpy()
        raise
    return out


def is_cuda_buffer(out: Any) -> bool:
    try:
        return hasattr(out, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 - torch raises for CPU tensors on some versions
        return False


class KvikioShard:
    """One shard read through kvikio: device buffers by cuFile (GDS or compat mode), host buffers by pread.

    Args:
        fd: the validated shard file descriptor (not kept; a dup is, for host reads).
        path: the shard's real path: kvikio opens it again, and the two must be the same file.
        size: the shard's size in bytes.
        task_size: bytes per kvikio task (reads are split and run by kvikio's thread pool).

    Raises:
        MissingDependencyError: kvikio is not installed, or there is no CUDA driver/GPU.
        DatasetChangedError: the path no longer names the file behind ``fd``.
    """

    def __init__(self, fd: int, path: str, size: int, *, task_size: int = DEFAULT_TASK_SIZE) -> None:
        kvikio = import_kvikio()
        _require_cuda_driver("the kvikio backend", path)
        self.path = path
        self.size = size
        self.task_size = int(task_size)
        self._host = PreadShard(fd, path, size)
        try:
            self._file = kvikio.CuFile(path, "r")
        except Exception as exc:  # kvikio raises RuntimeError for open/register failures
            self._host.close()
            raise GpuPathError(f"kvikio cannot open the shard ({exc}); read it with backend='pread' or "
                               f"'direct', or check the cuFile setup (cufile.json, /run/udev)", path=path) from None
        try:
            mine, theirs = os.fstat(self._file.fileno()), os.fstat(fd)
        except (OSError, AttributeError, TypeError):
            mine = theirs = None
        if mine is not None and (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
            self.close()
            raise DatasetChangedError("the shard file was replaced between validation and the kvikio open",
                                      path=path)

    def _check_range(self, offset: int, nbytes: int) -> None:
        if offset < 0 or offset + nbytes > self.size:
            raise OffsetOutOfBoundsError(f"read of {nbytes} bytes at {offset} runs past the shard's "
                                         f"{self.size} bytes", path=self.path, offset=offset)

    def start_read(self, offset: int, out: Any) -> Callable[[], None]:
        """Start filling ``out`` from ``offset``; returns a function that waits and checks the length.

        Device buffers are read asynchronously by kvikio's pool; host buffers are read now.
        Call the returned function before ``out`` is freed or the shard closed, also when
        another read failed: kvikio's future does not wait when it is dropped, and its threads
        would go on writing into ``out``.
        """
        if not is_cuda_buffer(out):
            self._host.read_into(offset, host_view(out))
            return _done
        nbytes = cuda_nbytes(out)
        self._check_range(offset, nbytes)
        try:
            future = self._file.pread(out, nbytes, offset, task_size=self.task_size)
        except RuntimeError as exc:  # kvikio reports cuFile/POSIX failures as RuntimeError
            raise GpuPathError(f"kvikio could not start a read of {nbytes} bytes at {offset}: {exc}",
                               path=self.path, offset=offset) from None

        def wait() -> None:
            try:
                got = int(future.get())
            except RuntimeError as exc:
                raise GpuPathError(f"kvikio read of {nbytes} bytes at {offset} failed: {exc}", path=self.path,
                                   offset=offset) from None
            if got != nbytes:
                raise TruncatedFileError(f"kvikio read {got} of {nbytes} bytes at {offset}", path=self.path,
                                         offset=offset + got)
        # The shard stays open while its read is in flight, even if the dataset's cache drops it.
        wait.backend = self  # type: ignore[attr-defined]
        return wait

    def read_into(self, offset: int, out: Any) -> None:
        """Fill ``out`` (a CUDA array or a writable host buffer) with the bytes at ``offset``."""
        self.start_read(offset, out)()

    def view(self, offset: int, size: int) -> memoryview:
        """The bytes at ``offset`` in a fresh host buffer (pread)."""
        return self._host.view(offset, size)

    def close(self) -> None:
        file = getattr(self, "_file", None)
        if file is not None:
            self._file = None
            file.close()
        host = getattr(self, "_host", None)
        if host is not None:
            host.close()

    def __del__(self) -> None:
        # An evicted shard closes with its last reference, never under a reader (packer.dataset).
        try:
            self.close()
        except Exception:
            pass


def _done() -> None:
    return None


