"""Source names that are not valid UTF-8: the reversible escaped key they are packed under.

Index keys are UTF-8 text (SPEC.md §5), but file systems and archives hold names as bytes, and
an old archive's Latin-1 ``caf\\xe9.jpg`` is not UTF-8. Such a name is packed, not lost:

* **Key**: every byte that is not part of a valid UTF-8 sequence is written ``%XX`` (two upper
  case hex digits), and so is every ``%`` byte of that name (``%25``), so the escape is
  unambiguous: ``caf\\xe9 100%.jpg`` becomes ``caf%E9 100%25.jpg``. A name that is valid UTF-8
  is never changed, whatever it contains.
* **Marker**: the sample's metadata holds ``"escaped_name": true`` (``ESCAPED_FIELD``), so a
  reader knows which keys to unescape; ``unescape_key`` gives back the original bytes, which
  ``packer export`` writes as the file name.
"""

from __future__ import annotations

import re

__all__ = ["ESCAPED_FIELD", "ESCAPED_META", "escape_name", "is_utf8", "unescape_key", "source_name"]

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


def escape_name(name: bytes) -> str:
    """The key for source name ``name``: itself if UTF-8, else its percent-escaped form (module docstring)."""
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        pass
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
