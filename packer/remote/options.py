"""``RemoteOptions``: how a dataset in object storage is reached, fetched and cached (one frozen value)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from ..errors import OptionError
from .url import is_url, redact

__all__ = ["RemoteOptions", "TRANSPORTS", "default_cache_dir", "as_remote_options"]

#: Transports: fsspec (s3fs / gcsfs / adlfs / HTTP) is the default because it is fork-safe (a
#: client made after a fork works); obstore's process-wide tokio runtime hangs in a forked
#: DataLoader worker once the parent has used it (docs/guides/object-storage.md, "Transport").
TRANSPORTS = ("fsspec", "obstore")


def default_cache_dir() -> Path:
    """``$PACKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/packer``, else ``~/.cache/packer`` (read at call time)."""
    if os.environ.get("PACKER_CACHE_DIR"):
        return Path(os.environ["PACKER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packer"


@dataclass(frozen=True)
class RemoteOptions:
    """Options for a dataset URL (``packer.open_dataset(url, remote=RemoteOptions(...))``).

    Attributes:
        endpoint_url: an S3-compatible endpoint (MinIO, R2, a local test server); None for the
            provider's own.
        region: the S3 region (None: the credential chain's / the bucket's).
        storage_options: extra keyword arguments for the transport's client (e.g. s3fs's
            ``requester_pays``). Credentials are better left to the standard chain
            (environment, config files, instance roles): nothing here is ever printed or written
            to a dataset or the cache.
        transport: ``"fsspec"`` (default) or ``"obstore"`` (see ``TRANSPORTS``).
        cache_dir: the node-local cache folder shared by every process of the node
            (default ``default_cache_dir()``).
        cache_bytes: the cache's size bound in bytes (extents beyond it are evicted, what the
            read order needs latest first); 0 for no bound.
        extent_bytes: the cache unit: runs of consecutive samples of about this many bytes
            (cut at sample boundaries, so each is checked sample by sample on entry).
        request_bytes: the most bytes one range GET fetches (adjacent extents are coalesced).
        in_flight: range GETs kept in flight by one process.
        lookahead_bytes: how far ahead of the reader the prefetcher fetches, in bytes.
        retries: attempts per request (the first included) before a transient failure is final.
        deadline_s: the most seconds one range may take over all its attempts.
        timeout_s: the socket timeout of one request (a slow response is abandoned and retried).
        backoff_s: the first retry's pause; doubles per retry (with jitter), capped at 5 s.
    """

    endpoint_url: str | None = None
    region: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    transport: str = "fsspec"
    cache_dir: str | None = None
    cache_bytes: int = 0
    extent_bytes: int = 4 << 20
    request_bytes: int = 16 << 20
    in_flight: int = 8
    lookahead_bytes: int = 256 << 20
    retries: int = 8
    deadline_s: float = 120.0
    timeout_s: float = 30.0
    backoff_s: float = 0.05

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise OptionError(f"unknown transport {self.transport!r}; choose one of {', '.join(TRANSPORTS)}")
        for name in ("extent_bytes", "request_bytes", "in_flight", "lookahead_bytes", "retries"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OptionError(f"RemoteOptions.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.cache_bytes, int) or self.cache_bytes < 0:
            raise OptionError(f"RemoteOptions.cache_bytes must be 0 (no bound) or a positive integer, "
                              f"got {self.cache_bytes!r}")
        for name in ("deadline_s", "timeout_s", "backoff_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise OptionError(f"RemoteOptions.{name} must be a positive number, got {value!r}")
        if self.request_bytes < self.extent_bytes:
            object.__setattr__(self, "request_bytes", self.extent_bytes)

    @property
    def cache_root(self) -> Path:
        """The node cache folder: ``cache_dir``, else ``default_cache_dir()``.

        Raises:
            OptionError: the setting is a URL (the cache is a local folder every process of the
                node maps files from), or it, or a folder above it, is a file; the message names
                the setting (``RemoteOptions.cache_dir``, ``$PACKER_CACHE_DIR``) and the path.
        """
        if self.cache_dir:
            setting, root = "RemoteOptions.cache_dir", str(self.cache_dir)
        elif os.environ.get("PACKER_CACHE_DIR"):
            setting, root = "$PACKER_CACHE_DIR", os.environ["PACKER_CACHE_DIR"]
        else:
            setting, root = "the default cache folder ($XDG_CACHE_HOME or ~/.cache)", str(default_cache_dir())
        if is_url(root):
            raise OptionError(f"{setting} must be a local folder, got the URL {redact(root)} (the node cache holds "
                              f"the files every process of the node maps)")
        folder = Path(root)
        for probe in (folder, *folder.parents):  # the first that exists must be a folder
            if probe.exists():
                if not probe.is_dir():
                    raise OptionError(f"{setting} is not a folder: {probe} is a file", path=folder)
                break
        return folder

    def __repr__(self) -> str:  # storage_options may hold secrets: never shown
        # an endpoint may carry user-info (http://key:secret@host): shown redacted
        shown = ", ".join(f"{f.name}={redact(repr(getattr(self, f.name)))}" for f in fields(self) if f.repr)
        hidden = f", storage_options=<{len(self.storage_options)} keys>" if self.storage_options else ""
        return f"RemoteOptions({shown}{hidden})"

    def with_(self, **changes: Any) -> "RemoteOptions":
        return replace(self, **changes)


def as_remote_options(value: RemoteOptions | Mapping[str, Any] | None) -> RemoteOptions:
    """``value`` as ``RemoteOptions`` (a mapping gives its fields; None the defaults).

    Raises:
        OptionError: an unknown field or a bad value.
    """
    if value is None:
        return RemoteOptions()
    if isinstance(value, RemoteOptions):
        return value
    if isinstance(value, Mapping):
        known = {f.name for f in fields(RemoteOptions)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise OptionError(f"unknown remote option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return RemoteOptions(**value)
    raise OptionError(f"remote= takes RemoteOptions or a dict, got {type(value).__name__}")
