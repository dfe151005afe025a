"""Where a path a user gives points: a local path or a URL, parsed once by ``parse_location``.

Every command argument and option that names a place (a dataset, ``OUT``, ``--classes-from``,
``--keys``, ``--html``, ``--fields``, ``--root``, a source, ...) and every library function that
takes one (``open_dataset``, ``build``, ``append``, ``export``, ``verify``) parses it here, once:

- a string spelled ``scheme://...`` is a URL (``packer.remote.url``: ``s3://``, ``gs://``,
  ``az://``, ``https://``, ``http://``), and ``file:///path`` is the local path ``/path``;
- a ``pathlib.Path`` (any ``os.PathLike``) and every other string is a local path;
- a string that starts like a URL with a slash missing (``s3:/bucket``, ``gs:bucket``) is refused:
  it would otherwise become a local folder named ``s3:``.

What holds the bytes then takes the ``Location`` as it is (``packer.place`` opens a dataset at
either; the writer uploads to a URL); the code above it never asks which it has. Where only a
local path can work, ``Location.local_path`` (also ``os.fspath``: a ``Location`` is path-like)
is a typed refusal naming the option and the URL, never a folder named ``s3:``.

A URL is shown only through ``Location.display`` (and ``str``): its user-info and query, where a
signed URL keeps its token, are redacted (``packer.remote.url.redact``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from .errors import OptionError
from .remote.url import SCHEMES, DatasetURL, is_url, object_key, parse_url, redact

__all__ = ["Location", "parse_location"]

#: A known scheme followed by ``:`` but not ``//``: a URL with a slash missing, not a folder name.
_ALMOST_URL = re.compile(rf"^({'|'.join(SCHEMES)}):(?!//)", re.IGNORECASE)


@dataclass(frozen=True)
class Location:
    """A place a user named: a local path (``path``) or a URL (``url``), exactly one of them.

    Attributes:
        path: the local path (``file://`` URLs included), or None for a URL.
        url: the parsed URL (``packer.remote.url.DatasetURL``), or None for a local path.
        what: how the user named it (``"OUT"``, ``"--html"``, ``"the dataset"``), for messages;
            not part of equality.
    """

    path: Path | None = None
    url: DatasetURL | None = None
    what: str = field(default="the path", compare=False)

    def __post_init__(self) -> None:
        if (self.path is None) == (self.url is None):
            raise OptionError("a Location is a local path or a URL: give exactly one of path= and url=")

    @property
    def text(self) -> str:
        """The location as a string that ``parse_location`` reads back: the URL, or the path."""
        return self.url.text if self.url is not None else str(self.path)

    @property
    def display(self) -> str:
        """The location for messages and logs: a URL's user-info and query redacted."""
        return redact(self.text) if self.url is not None else str(self.path)

    def __str__(self) -> str:
        return self.display

    def __repr__(self) -> str:
        return f"Location({self.display!r})"

    def local_path(self, why: str = "") -> Path:
        """The local path.

        Args:
            why: what needs a local path, for the refusal (``"the report is written to a local file"``).

        Raises:
            OptionError: this is a URL (the message names ``what`` and the URL, redacted).
        """
        if self.path is None:
            raise OptionError(f"{self.what} needs a local path, got the URL {self.display}"
                              + (f": {why}" if why else ""))
        return self.path

    def __fspath__(self) -> str:
        # A URL handed to code that opens local files is a typed refusal, never a folder named "s3:".
        return str(self.local_path())

    def check_local(self, check: Callable[[Path], Path]) -> "Location":
        """This location, its local path passed through ``check`` (an existence test, a rewrite);
        a URL is returned as it is (it is checked where it is opened)."""
        return self if self.path is None else replace(self, path=check(self.path))

    def __truediv__(self, name: str) -> "Location":
        """The location of ``name`` inside this one (``OUT / "build-report.jsonl"``).

        Raises:
            UnsafePathError: ``name`` would leave a URL's prefix.
        """
        if self.url is None:
            return replace(self, path=self.path / name)  # type: ignore[operator]
        url = self.url
        return replace(self, url=replace(url, text=f"{url.text}/{name}",
                                         prefix=object_key(url.prefix, name, where=url.text)))


def _redacted_almost(value: str, scheme: str) -> str:
    """``value`` (``s3:/bucket?sig=...``) with what ``redact`` hides of the URL it was meant to be."""
    rest = value[len(scheme) + 1:]
    slashes = len(rest) - len(rest.lstrip("/"))
    meant = redact(f"{scheme}://{rest[slashes:]}")
    return value[:len(scheme) + 1 + slashes] + meant[len(scheme) + 3:]


def parse_location(value: str | os.PathLike[str] | Location, *, what: str = "the path") -> Location:
    """Parse what a user gave as a place, once (see the module docstring).

    Args:
        value: a string (a path, or a URL), an ``os.PathLike`` (always a local path), or a
            ``Location`` (returned as it is: it keeps the name it was parsed under).
        what: how the user named it, for messages (``"OUT"``, ``"--keys"``).

    Raises:
        OptionError: a URL packer cannot use (unknown scheme, query, credentials in it, no
            bucket), a string that is a URL with a slash missing, or a value that is neither a
            string nor a path.
    """
    if isinstance(value, Location):
        return value
    if isinstance(value, str):
        if is_url(value):
            try:
                url = parse_url(value)
            except OptionError as exc:
                raise OptionError(f"{what}: {exc.message}") from None
            if url.scheme == "file":
                return Location(path=Path(url.local_path), what=what)
            return Location(url=url, what=what)
        almost = _ALMOST_URL.match(value)
        if almost:
            shown = _redacted_almost(value, almost.group(1))
            raise OptionError(f"{what} {shown!r} looks like a URL with a slash missing ({almost.group(1).lower()}://"
                              f"...); for a local path of that name write ./{shown}")
        return Location(path=Path(value), what=what)
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return Location(path=Path(path), what=what)
    raise OptionError(f"{what} must be a path or a URL (a string or a pathlib.Path), got {type(value).__name__}")
