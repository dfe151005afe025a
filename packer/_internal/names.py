"""Source names as keys: one-to-one for every name, the escaped key of a name that is not plain text.

Index keys are UTF-8 text (SPEC.md §5), but file systems and archives hold names as bytes, and
an old archive's Latin-1 ``caf\\xe9.jpg`` is not UTF-8. Such a name is packed, not lost:

* **Plain names** (valid UTF-8 holding no ``%`` followed by two upper case hex digits) are their
  own key, unchanged: nearly every name, ``100%.jpg`` included.
* **Every other name** is escaped: each byte that is not part of a valid UTF-8 sequence is
  written ``%XX`` (two upper case hex digits), and so is every ``%`` byte of the name (``%25``):
  ``caf\\xe9 100%.jpg`` becomes ``caf%E9 100%25.jpg``, and the UTF-8 name ``caf%E9.jpg`` (a
  Latin-1 name's escaped spelling, written out) becomes ``caf%25E9.jpg``.
* **One-to-one**: an escaped key always holds a ``%XX`` (the escape of a bad byte, or the ``%25``
  of the ``%`` that made the name not plain) and a plain key never does, so no escaped key equals a
  plain one, and escaping is reversible; two different names never share a key
  (``tests/sources/test_names.py``, a hypothesis property over every byte string).
* **Every door alike**: a door that lists names as bytes (folders, tar, zip, WebDataset) escapes
  them as it lists; a name a door reads as text (a manifest's path, a COCO ``file_name``, a Parquet
  or Hugging Face row's path) is escaped the same way when it is listed (``listed_key``, called by
  ``sources.listing.RawListingBuilder.add``), so a file has one key whichever door lists it and an
  export built again gives it back.
* **Marker**: the sample's metadata holds ``"escaped_name": true`` (``ESCAPED_FIELD``), so a
  reader knows which keys to unescape; ``unescape_key`` gives back the original bytes, which
  ``packer export`` writes as the file name.

Before this rule a valid UTF-8 name was never changed, so a Latin-1 name and its percent-escaped
spelling in one folder shared a key and one of them was dropped as a duplicate.
"""

from __future__ import annotations

import json
import re

__all__ = ["ESCAPED_FIELD", "ESCAPED_META", "escape_name", "is_utf8", "is_plain", "unescape_key", "source_name",
           "listed_key"]

#: The metadata field that marks a sample whose key is an escaped name.
ESCAPED_FIELD = "escaped_name"
#: The whole metadata of a folder entry whose name was escaped (canonical JSON).
ESCAPED_META = b'{"escaped_name":true}'


def is_utf8(name: bytes) -> bool:
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


#: What makes a UTF-8 name not plain: it already holds an escape's spelling.
_ESCAPE_SPELLING = re.compile(rb"%[0-9A-F]{2}")


def is_plain(name: bytes) -> bool:
    """Whether ``name`` is its own key: valid UTF-8 without a ``%XX`` in it (module docstring)."""
    if b"%" in name and _ESCAPE_SPELLING.search(name):
        return False
    return is_utf8(name)


def escape_name(name: bytes) -> str:
    """The key for source name ``name``: itself if plain, else its percent-escaped form (module
    docstring); a name that is not plain needs the ``ESCAPED_FIELD`` marker."""
    if is_plain(name):
        return name.decode("utf-8")
    out: list[str] = []
    position = 0
    while position < len(name):
        try:
            text = name[position:].decode("utf-8")
            out.append(text.replace("%", "%25"))
            break
        except UnicodeDecodeError as exc:
            good = name[position:position + exc.start].decode("utf-8")
            out.append(good.replace("%", "%25"))
            bad = name[position + exc.start:position + exc.end]
            out.append("".join(f"%{b:02X}" for b in bad))
            position += exc.end
    return "".join(out)


def source_name(key: str, meta: bytes) -> bytes | None:
    """The original name bytes of a listed entry whose key was escaped (its ``meta`` says so), else None."""
    if "%" not in key or b'"escaped_name":true' not in meta:
        return None
    return unescape_key(key)


def unescape_key(key: str, escaped: bool = True) -> bytes:
    """The original name bytes of ``key`` (``escaped``: the sample's metadata carries ``ESCAPED_FIELD``)."""
    if not escaped:
        return key.encode("utf-8")
    return re.sub(rb"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]), key.encode("utf-8"))


def listed_key(name: bytes, meta: bytes = b"") -> tuple[bytes, bytes]:
    """A listed entry's key and metadata: ``name`` and ``meta`` as they are when the name is plain,
    else the escaped key and ``meta`` with the ``ESCAPED_FIELD`` marker (a key already escaped,
    whose ``meta`` carries the marker, is kept). Every door's listing goes through here
    (``sources.listing.RawListingBuilder.add``), so a name gets one key whatever door lists it."""
    if b"%" not in name or b'"escaped_name":true' in meta or is_plain(name):
        return name, meta
    key = escape_name(name).encode("utf-8")
    if not meta:
        return key, ESCAPED_META
    document = json.loads(meta)
    document[ESCAPED_FIELD] = True
    return key, json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

