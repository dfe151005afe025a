"""The transport: one client per process (fork-aware), range GETs with retries, backoff and a deadline.

Two transports sit behind one small protocol (``get_range``, ``get``, ``head``, ``put_file``,
``put_bytes``, ``delete``): fsspec (s3fs, gcsfs, adlfs, HTTP; the default) and obstore (Rust
``object_store``). Both come from well-kept libraries; packer writes no HTTP. ``Store`` adds what
training needs on top: a request that fails transiently (a reset connection, 5xx, 429/503
throttling, a truncated body, a timeout) is retried with exponential backoff and jitter until
``RemoteOptions.retries`` attempts or ``deadline_s`` have passed; then, or at once for a
permanent answer (404, 403), a ``RemoteStoreError`` names the object and the range.

Fork safety: ``store_for`` keeps one client per (process, store); a forked DataLoader worker
never uses a client its parent made (the table is dropped in the child, ``os.register_at_fork``),
it makes its own. obstore's tokio runtime is process-wide and does not survive a fork: a child of
a process that used it would hang, so ``ObstoreTransport`` refuses to run there (typed error).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from ..errors import MissingDependencyError, OptionError, PackerError, RemoteStoreError
from .options import RemoteOptions
from .url import DatasetURL, redact

__all__ = ["ObjectInfo", "Transport", "Store", "store_for", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'packer-shards[remote]'"
#: The narrow extra that installs one kind of URL's transport (``[remote]`` installs them all).
SCHEME_EXTRAS = {"s3": "s3", "gs": "gcs", "az": "azure", "https": "http", "http": "http"}


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    etag: str | None


class Transport(Protocol):
    """What a transport does: keys are relative to the dataset URL's bucket (prefix included)."""

    def get_range(self, key: str, start: int, end: int) -> Any: ...

    def get(self, key: str) -> bytes: ...

    def head(self, key: str) -> ObjectInfo: ...

    def put_file(self, key: str, path: str) -> None: ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


class _Permanent(Exception):
    """A failure that retrying cannot fix (not found, access denied, precondition failed)."""


class _Truncated(Exception):
    pass


def _missing(package: str, exc: BaseException, scheme: str = "") -> MissingDependencyError:
    extra = SCHEME_EXTRAS.get(scheme, "remote")
    return MissingDependencyError(f"reading datasets in object storage needs {package} ({exc}); install it with "
                                  f"pip install 'packer-shards[{extra}]' (or [remote]: every store)")


class FsspecTransport:
    """fsspec's filesystems: s3fs (``s3://``), gcsfs (``gs://``), adlfs (``az://``), HTTP (``https://``)."""

    _PROTOCOLS = {"s3": "s3", "gs": "gcs", "az": "az", "https": "https", "http": "http"}

    def __init__(self, url: DatasetURL, options: RemoteOptions) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise _missing("fsspec", exc, url.scheme) from None
        protocol = self._PROTOCOLS[url.scheme]
        kwargs: dict[str, Any] = {"skip_instance_cache": True}
        if protocol == "s3":
            try:
                import s3fs  # noqa: F401
            except ImportError as exc:
                raise _missing("s3fs", exc, url.scheme) from None
            # packer retries (one policy for every transport, counted per range): botocore's
            # own retries are off, its timeouts are ours.
            kwargs.update(config_kwargs={"retries": {"max_attempts": 1, "mode": "standard"},
                                                    "connect_timeout": options.timeout_s,
                                                    "read_timeout": options.timeout_s})
            if options.endpoint_url:
                kwargs["endpoint_url"] = options.endpoint_url
            if options.region:
                kwargs["client_kwargs"] = {"region_name": options.region}
        elif protocol in ("http", "https"):
            try:
                import aiohttp  # fsspec[http]'s client ([http]; s3fs brings it too)
            except ImportError as exc:
                raise _missing("aiohttp", exc, url.scheme) from None

            kwargs["client_kwargs"] = {"timeout": aiohttp.ClientTimeout(total=options.timeout_s)}
        kwargs.update(options.storage_options)
        try:
            self.fs = fsspec.filesystem(protocol, **kwargs)
        except ImportError as exc:
            raise _missing(f"fsspec's {protocol} filesystem", exc, url.scheme) from None
        self._root = (f"{url.scheme}://{url.bucket}" if protocol in ("http", "https") else url.bucket)

    def _path(self, key: str) -> str:
        return f"{self._root}/{key}"

    def get_range(self, key: str, start: int, end: int) -> Any:
        return self.fs.cat_file(self._path(key), start=start, end=end)

    def get(self, key: str) -> bytes:
        return self.fs.cat_file(self._path(key))

    def head(self, key: str) -> ObjectInfo:
        info = self.fs.info(self._path(key))
        etag = info.get("ETag") or info.get("etag")
        return ObjectInfo(size=int(info["size"]), etag=str(etag) if etag else None)

    def put_file(self, key: str, path: str) -> None:
        # s3fs uploads a large file as a multipart upload, parts in parallel (max_concurrency).
        self.fs.put_file(path, self._path(key))

    def put_bytes(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(key), data)

    def delete(self, key: str) -> None:
        self.fs.rm_file(self._path(key))


#: The process that first used obstore's runtime (it cannot be used again after a fork).
_OBSTORE_PID: int | None = None


class ObstoreTransport:
    """obstore (Rust ``object_store``): S3, GCS, Azure and HTTP with native range reads."""

    def __init__(self, url: DatasetURL, options: RemoteOptions) -> None:
        global _OBSTORE_PID
        if _OBSTORE_PID is not None and _OBSTORE_PID != os.getpid():
            raise RemoteStoreError(
                "transport='obstore' cannot run in a process forked from one that already used it (its "
                "tokio runtime does not survive fork: the request would hang); use the default "
                "transport='fsspec', or start workers with multiprocessing_context='spawn'", path=url.text)
        try:
            import obstore
            from obstore.store import from_url
        except ImportError as exc:
            raise _missing("obstore", exc, url.scheme) from None
        _OBSTORE_PID = os.getpid()
        self._obstore = obstore
        client_options: dict[str, Any] = {"timeout": f"{options.timeout_s}s",
                                          "connect_timeout": f"{options.timeout_s}s"}
        config: dict[str, Any] = {}
        if options.endpoint_url:
            config["endpoint"] = options.endpoint_url
            client_options["allow_http"] = options.endpoint_url.startswith("http://")
        if url.scheme == "http":
            client_options["allow_http"] = True
        if options.region:
            config["region"] = options.region
        config.update(options.storage_options)
        root = f"{url.scheme}://{url.bucket}/"
        # packer retries (one policy for every transport): object_store's own retries are off.
        try:
            self.store = from_url(root, config=config or None, client_options=client_options,
                                  retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=options.deadline_s),
                                                "backoff": {"init_backoff": timedelta(milliseconds=10),
                                                            "max_backoff": timedelta(milliseconds=10), "base": 2}})
        except Exception as exc:  # noqa: BLE001 - obstore's configuration errors (no Azure account, a bad key)
            raise OptionError(f"cannot make an obstore client for {url.text}: {_first_line(exc)} (give the store's "
                              f"settings in RemoteOptions.storage_options or its environment variables, e.g. "
                              f"AZURE_STORAGE_ACCOUNT_NAME)", path=url.text) from None

    def _classify(self, exc: Exception) -> Exception:
        from obstore import exceptions as errors

        if isinstance(exc, (FileNotFoundError, errors.NotFoundError, errors.PermissionDeniedError,
                            errors.UnauthenticatedError, PermissionError)):
            return _Permanent(str(exc).splitlines()[0])
        return exc

    def get_range(self, key: str, start: int, end: int) -> Any:
        try:
            return self._obstore.get_range(self.store, key, start=start, end=end)
        except Exception as exc:  # noqa: BLE001 - classified, then retried or raised by Store
            raise self._classify(exc) from None

    def get(self, key: str) -> bytes:
        try:
            return bytes(self._obstore.get(self.store, key).bytes())
        except Exception as exc:  # noqa: BLE001
            raise self._classify(exc) from None

    def head(self, key: str) -> ObjectInfo:
        try:
            meta = self._obstore.head(self.store, key)
        except Exception as exc:  # noqa: BLE001
            raise self._classify(exc) from None
        return ObjectInfo(size=int(meta["size"]), etag=meta.get("e_tag"))

    def put_file(self, key: str, path: str) -> None:
        with open(path, "rb") as file:
            self._obstore.put(self.store, key, file, use_multipart=os.path.getsize(path) > (8 << 20),
                              chunk_size=8 << 20, max_concurrency=8)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._obstore.put(self.store, key, data)

    def delete(self, key: str) -> None:
        self._obstore.delete(self.store, key)


class Store:
    """One dataset URL's objects through a transport, with retries, a deadline and request counts.

    Attributes:
        url: the dataset URL.
        requests, bytes_read: GETs sent (retries included) and bytes received by this process.
    """

    def __init__(self, url: DatasetURL, options: RemoteOptions, transport: Transport | None = None) -> None:
        self.url = url
        self.options = options
        if transport is None:
            transport = (ObstoreTransport if options.transport == "obstore" else FsspecTransport)(url, options)
        self.transport = transport
        self.requests = 0
        self.bytes_read = 0
        self.retried = 0
        self._lock = threading.Lock()
        self._jitter = random.Random(os.getpid() ^ id(self))  # pauses only: never touches data

    def key(self, relative: str) -> str:
        return self.url.key(relative)

    def _attempts(self, what: str, call: Any, expect: int | None) -> Any:
        options = self.options
        started = time.monotonic()
        pause = options.backoff_s
        attempt = 0
        while True:
            attempt += 1
            with self._lock:
                self.requests += 1
            try:
                data = call()
                if expect is not None and len(data) != expect:
                    raise _Truncated(f"got {len(data)} of {expect} bytes")
                if expect is not None:
                    with self._lock:
                        self.bytes_read += len(data)
                return data
            except (_Permanent, FileNotFoundError, PermissionError) as exc:
                raise RemoteStoreError(f"{what} failed: {_first_line(exc)} (not retried: the store answered "
                                       f"that it does not exist or may not be read)", path=self.url.text) from None
            except (PackerError, TypeError, AttributeError, NameError):
                raise  # packer's own errors, and programming errors, are not the network's
            except Exception as exc:  # noqa: BLE001 - transient by default: reset, 5xx, 429/503, truncated, timeout
                elapsed = time.monotonic() - started
                wait = min(pause, 5.0) * (0.5 + self._jitter.random())
                if attempt >= options.retries or elapsed + wait > options.deadline_s:
                    raise RemoteStoreError(
                        f"{what} failed after {attempt} attempt{'s' * (attempt > 1)} in {elapsed:.1f} s: "
                        f"{type(exc).__name__}: {_first_line(exc)}", path=self.url.text) from None
                with self._lock:
                    self.retried += 1
                time.sleep(wait)
                pause *= 2

    def read_range(self, relative: str, start: int, end: int, *, what: str | None = None) -> Any:
        """Bytes ``[start, end)`` of ``relative`` (a bytes-like object of exactly that length).

        Raises:
            RemoteStoreError: a permanent failure, or transient ones past the retries or deadline;
                the message names the object and the range.
        """
        key = self.key(relative)
        label = what or relative
        return self._attempts(f"range GET {label} bytes {start}-{end}", lambda: self.transport.get_range(key, start, end),
                              end - start)

    def read_object(self, relative: str) -> bytes:
        key = self.key(relative)
        return bytes(self._attempts(f"GET {relative}", lambda: self.transport.get(key), None))

    def head(self, relative: str) -> ObjectInfo | None:
        """The object's size and ETag, or None when it does not exist."""
        key = self.key(relative)
        try:
            return self._attempts(f"HEAD {relative}", lambda: self.transport.head(key), None)
        except RemoteStoreError as exc:
            if "not retried" in exc.message:
                return None
            raise

    def put_file(self, relative: str, path: str) -> None:
        key = self.key(relative)
        self._attempts(f"upload {relative}", lambda: self.transport.put_file(key, path), None)

    def put_bytes(self, relative: str, data: bytes) -> None:
        key = self.key(relative)
        self._attempts(f"upload {relative}", lambda: self.transport.put_bytes(key, data), None)

    def delete(self, relative: str) -> None:
        key = self.key(relative)
        try:
            self._attempts(f"DELETE {relative}", lambda: self.transport.delete(key), None)
        except RemoteStoreError as exc:
            if "not retried" not in exc.message:
                raise


def _first_line(exc: BaseException) -> str:
    """The first line of a transport's error, its URLs' secrets redacted (a library may quote the
    request URL, endpoint user-info or a signed query included)."""
    text = redact(str(exc).strip())
    return (text.splitlines() or [type(exc).__name__])[0][:300]


_STORES: dict[tuple[Any, ...], Store] = {}
_STORES_LOCK = threading.Lock()


def _forget_stores() -> None:
    """In a forked child: drop the parent's clients without touching them (they are not ours)."""
    global _STORES_LOCK
    _STORES.clear()
    _STORES_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_stores)


def store_for(url: DatasetURL, options: RemoteOptions) -> Store:
    """This process's ``Store`` for ``url`` (made on first use; a forked child makes its own)."""
    key = (os.getpid(), url.scheme, url.bucket, url.prefix, options.transport, options.endpoint_url, options.region,
           repr(sorted((str(k), repr(v)) for k, v in options.storage_options.items())),
           options.retries, options.deadline_s, options.timeout_s, options.backoff_s)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = Store(url, options)
        return store
