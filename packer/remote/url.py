"""Dataset URLs: which strings name a dataset in object storage, and how they split into store and key."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from ..errors import OptionError, UnsafePathError

__all__ = ["SCHEMES", "WRITABLE_SCHEMES", "DatasetURL", "is_url", "parse_url", "object_key", "redact"]

#: Schemes a dataset URL may use. ``http``/``https`` are read-only (a plain web server or a
#: bucket's public endpoint); ``file`` is a local folder spelled as a URL.
SCHEMES = ("s3", "gs", "az", "https", "http", "file")
#: Schemes ``packer build`` / ``append`` can write to.
WRITABLE_SCHEMES = ("s3", "gs", "az", "file")

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: A URL inside a message: up to the first blank or quote (what a message puts around a URL).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*")


def _redact_one(url: str) -> str:
    scheme, _, rest = url.partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:  # user-info (user:password@, a key:secret@): never shown
        authority = "<redacted>@" + authority.rpartition("@")[2]
    # a signed URL's query (X-Amz-Signature, a SAS token) or a fragment: never shown, from the
    # first of the two on (a fragment may hold a "?": what comes before it is no less secret)
    marks = [i for i in (tail.find(mark) for mark in "?#") if i >= 0]
    if marks:
        tail = tail[:min(marks) + 1] + "<redacted>"
    return f"{scheme}://{authority}{tail}"


def redact(text: str) -> str:
    """``text`` with the secrets of every URL in it hidden: user-info (``key:secret@``) and the query
    or fragment (a signed URL's signature or token) become ``<redacted>``; the rest stays readable.

    Every message and log line that shows a URL a user gave goes through here (``packer.location``'s
    display form, this module's refusals, the transports' error text).
    """
    return _URL_IN_TEXT.sub(lambda match: _redact_one(match.group()), text)


def is_url(value: object) -> bool:
    """Whether ``value`` is a string spelled ``scheme://...`` (a ``pathlib.Path`` never is)."""
    return isinstance(value, str) and bool(_URL.match(value))


@dataclass(frozen=True)
class DatasetURL:
    """A parsed dataset URL.

    Attributes:
        text: the URL as given, without a trailing slash.
        scheme: one of ``SCHEMES``.
        bucket: the bucket (``s3``, ``gs``), ``container`` (``az``), host[:port] (``http[s]``), or
            ``""`` for ``file``.
        prefix: the key prefix of the dataset folder inside the bucket (no leading or trailing
            slash; ``""`` for the bucket's root); for ``file`` the local folder.
    """

    text: str
    scheme: str
    bucket: str
    prefix: str

    @property
    def read_only(self) -> bool:
        return self.scheme not in WRITABLE_SCHEMES

    @property
    def local_path(self) -> str:
        """The folder of a ``file://`` URL."""
        if self.scheme != "file":
            raise OptionError(f"{self.text} is not a file:// URL")
        return self.prefix

    def key(self, relative: str) -> str:
        """The object key of ``relative`` (a manifest path such as ``shards/shard-00000.pks``).

        Raises:
            UnsafePathError: ``relative`` is absolute or climbs out of the dataset (R19).
        """
        return object_key(self.prefix, relative, where=self.text)

    def __str__(self) -> str:
        return self.text


def object_key(prefix: str, relative: str, *, where: str = "") -> str:
    """``prefix/relative`` for a dataset-relative path that stays inside the dataset (R19)."""
    parts = PurePosixPath(relative).parts
    if (not relative or relative.startswith("/") or "\\" in relative or any(p in ("..", ".") for p in parts)):
        raise UnsafePathError(f"path {relative!r} does not stay inside the dataset", path=where or None)
    return f"{prefix}/{relative}" if prefix else relative


def parse_url(text: str | os.PathLike[str]) -> DatasetURL:
    """Split a dataset URL into scheme, bucket and prefix.

    Raises:
        OptionError: not a URL, an unknown scheme, or no bucket/host.
    """
    raw = os.fspath(text)
    if not is_url(raw):
        raise OptionError(f"{redact(raw)!r} is not a URL (expected scheme://bucket/path with scheme one of "
                          f"{', '.join(SCHEMES)})")
    try:
        parts = urlsplit(raw)
    except ValueError as exc:  # a malformed host ("s3://[bucket/ds": an unclosed IPv6 bracket)
        raise OptionError(f"{redact(raw)!r} is not a URL packer can read ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise OptionError(f"unsupported URL scheme {scheme!r} in {redact(raw)!r}; packer reads "
                          f"{', '.join(s + '://' for s in SCHEMES)}")
    if parts.query or parts.fragment:
        raise OptionError(f"a dataset URL takes no query or fragment: {redact(raw)!r} (store options go in "
                          f"RemoteOptions, credentials come from the environment)")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise OptionError(f"a file:// URL names a local folder (file:///path), got host "
                              f"{_redact_one('file://' + parts.netloc)[len('file://'):]!r}")
        path = unquote(parts.path).rstrip("/") or "/"
        # the root folder keeps its slashes: "file:///" stripped would be "file:", not a URL
        return DatasetURL(text=raw.rstrip("/") if path != "/" else raw, scheme=scheme, bucket="", prefix=path)
    if "@" in parts.netloc:
        raise OptionError("credentials do not go in a dataset URL; they come from the environment or the "
                          "store's standard credential chain")
    bucket = parts.netloc
    if not bucket:
        raise OptionError(f"no {'host' if scheme.startswith('http') else 'bucket'} in {redact(raw)!r}")
    prefix = unquote(parts.path).strip("/")
    if any(p in ("..", ".") for p in prefix.split("/") if p) or "//" in prefix:
        raise OptionError(f"the path of {redact(raw)!r} is not a plain key prefix")
    return DatasetURL(text=raw.rstrip("/"), scheme=scheme, bucket=bucket, prefix=prefix)
