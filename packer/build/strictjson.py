"""Strict JSON for source text: no NaN or Infinity, no number that overflows to infinity, bounded nesting.

Manifests (JSONL rows) and side files (a sample's ``.json``) are parsed by these rules, so a
value that strict JSON (RFC 8259) cannot hold is rejected with a reason instead of being stored
as NaN, and hostile nesting is refused before ``json.loads`` could end the build with a
``RecursionError``.
"""

from __future__ import annotations

import json

__all__ = ["MAX_JSON_DEPTH", "json_depth_ok", "parse_strict_json"]

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


def parse_strict_json(text: str | bytes) -> object:
    """``json.loads`` that refuses NaN, Infinity and numbers that overflow to infinity (``1e400``)."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
