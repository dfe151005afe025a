"""Codecs: how a checked source image becomes the payload bytes stored in a shard.

``passthrough`` (the default) stores the source bytes verbatim: no re-encoding, no quality loss.
A codec is named in the build options as ``name`` or ``name:key=value,...`` and recorded in the
manifest's ``codec`` object, so readers know what the payload bytes are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .errors import BuildError
from .imageinfo import ImageInfo

__all__ = ["Codec", "PassthroughCodec", "get_codec", "parse_codec_spec"]


class Codec(Protocol):
    name: str

    def encode(self, data: bytes, info: ImageInfo, *, name: str = "") -> tuple[bytes, ImageInfo]:
        """Return the payload to store and the info describing it."""

    def manifest_entry(self) -> dict[str, Any]:
        """The manifest's ``codec`` object."""


@dataclass(frozen=True)
class PassthroughCodec:
    name: str = "passthrough"

    def encode(self, data: bytes, info: ImageInfo, *, name: str = "") -> tuple[bytes, ImageInfo]:
        return data, info

    def manifest_entry(self) -> dict[str, Any]:
        return {"name": self.name}


def parse_codec_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"jpeg:quality=90,size=256"`` into ``("jpeg", {"quality": "90", "size": "256"})``."""
    name, _, rest = spec.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BuildError(f"codec option {item!r} in {spec!r} must look like key=value")
        params[key.strip()] = value.strip()
    return name.strip(), params


_CODECS: dict[str, Any] = {"passthrough": PassthroughCodec}


def get_codec(spec: str) -> Codec:
    """The codec named by ``spec``.

    Raises:
        BuildError: unknown codec or bad options.
    """
    name, params = parse_codec_spec(spec)
    factory = _CODECS.get(name)
    if factory is None:
        raise BuildError(f"unknown codec {name!r}; available: {', '.join(sorted(_CODECS))}")
    try:
        return factory(**params) if params else factory()
    except (TypeError, ValueError) as exc:
        raise BuildError(f"bad options for codec {name!r}: {exc}") from None
