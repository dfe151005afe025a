"""Strict JSON for source text: no NaN or Infinity, no number that overflows to infinity, bounded nesting.

Manifests (JSONL rows) and side files (a sample's ``.json``) are parsed by these rules, so a
value that strict JSON (RFC 8259) cannot hold is rejected with a reason instead of being stored
as NaN, and hostile nesting is refused before ``json.loads`` could end the build with a
``RecursionError``.
"""

from __future__ import annotations

import json
import re

__all__ = ["MAX_JSON_DEPTH", "json_depth_ok", "parse_strict_json", "lone_surrogate"]

#: Deepest bracket nesting accepted in source JSON (rows nested deeper are rejected unparsed).
MAX_JSON_DEPTH = 64


def json_depth_ok(line: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when no bracket nesting in ``line`` exceeds ``limit`` (brackets in strings ignored)."""
    depth = 0
    in_string = escaped = False
    if line.count("[") + line.count("{") <= limit:  # the common case: no scan needed
        return True
    for char in line:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return False
        elif char in "]}":
            depth -= 1
    return True


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number (strict JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text} is out of range (it would be stored as Infinity)")
    return value


#: A ``\uD800``-``\uDFFF`` escape: the only way JSON text read as UTF-8 can hold a surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE_ESCAPE_BYTES = re.compile(_SURROGATE_ESCAPE.pattern.encode())


def lone_surrogate(value: object) -> str | None:
    """The first string (key or value) in ``value`` that is not Unicode text, else None.

    JSON may spell an unpaired surrogate (``"\\ud800"``); ``json.loads`` returns it in a ``str``
    that cannot be written as UTF-8 (a report, a manifest, a file name), so sources refuse it.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def parse_strict_json(text: str | bytes) -> object:
    """``json.loads`` that refuses NaN, Infinity, numbers that overflow to infinity (``1e400``)
    and strings holding an unpaired surrogate escape (``"\\ud800"``: not Unicode text)."""
    value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    pattern = _SURROGATE_ESCAPE if isinstance(text, str) else _SURROGATE_ESCAPE_BYTES  # no decode per row
    if pattern.search(text):  # escaped pairs (an emoji) are fine: only then look closer
        bad = lone_surrogate(value)
        if bad is not None:
            raise ValueError(f"string {bad!r} holds an unpaired surrogate escape (not Unicode text)")
    return value
