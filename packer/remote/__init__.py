"""Datasets in object storage: one URL everywhere (``s3://``, ``gs://``, ``az://``, ``https://``, ``file://``).

A remote dataset is the same bytes as a local one (formats/SPEC.md, "Remote datasets"),
addressed by URL. The parts, each a module:

- ``url``: which strings are dataset URLs, and their bucket and key prefix;
- ``options``: ``RemoteOptions``, the one frozen value of transport, cache and prefetch settings;
- ``store``: the transport (fsspec or obstore) behind one protocol, one client per process
  (fork-aware), retries with backoff and a deadline, typed errors naming object and range;
- ``extents``: the range planner (extents cut at sample boundaries; an order as fetches);
- ``cache``: the node-local cache folder (atomic files, per-extent record locks, eviction);
- ``reader``: ``RemoteFiles`` (a URL at one manifest generation: the ``packer.place.Place`` a
  dataset holds for a URL) and ``RemoteShard`` (the ``ShardBackend`` the readers consume);
- ``upload``: ``packer build``/``append`` to a URL (shards, index, manifest last) and ``mirror``.

Nothing here is imported by ``import packer``; the transports are imported when a URL is opened,
and a missing one names the extra for its URL (``[s3]``, ``[gcs]``, ``[azure]``, ``[http]``; ``[remote]``: all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from .options import RemoteOptions
from .url import DatasetURL, is_url, parse_url

if TYPE_CHECKING:
    from .reader import RemoteFiles

__all__ = ["RemoteOptions", "DatasetURL", "is_url", "parse_url", "open_remote"]


def open_remote(url: str | DatasetURL, options: RemoteOptions | Mapping[str, Any] | None = None, *,
                manifest_bytes: bytes | None = None) -> "RemoteFiles":
    """Open ``url`` at its current manifest generation (or check it is still ``manifest_bytes``'s).

    Returns:
        a ``packer.remote.reader.RemoteFiles`` (the ``packer.place.Place`` of a URL).
    """
    from .options import as_remote_options
    from .reader import RemoteFiles

    settings = as_remote_options(options)  # a bad option is refused before any request
    return RemoteFiles(url if isinstance(url, DatasetURL) else parse_url(url), settings, manifest_bytes=manifest_bytes)
