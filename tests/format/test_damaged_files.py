"""Mutation tests: damaged files give a PackerError or identical bytes, never another exception."""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import packer
from packer import format as fmt

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "formats" / "vectors" / "valid" / "base-align512"
MANIFEST = (BASE / "manifest.json").read_bytes()
_MANIFEST_OBJ = json.loads(MANIFEST)
INDEX = (BASE / _MANIFEST_OBJ["index"]["path"]).read_bytes()
SHARDS = [(BASE / s["path"]).read_bytes() for s in _MANIFEST_OBJ["shards"]]
with packer.open_dataset(BASE) as _dataset:
    SAMPLES = [_dataset.read(i) for i in range(len(_dataset))]

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- byte mutations -------------------------------------------------------------------------------

@st.composite
def mutated(draw: st.DrawFn, data: bytes, focus: int | None = None) -> bytes:
    """``data`` flipped, truncated, extended, overwritten or spliced (``focus``: mostly in the first bytes)."""
    kind = draw(st.sampled_from(["flip", "truncate", "extend", "overwrite", "insert", "delete", "u64"]))
    limit = len(data) if focus is None or draw(st.booleans()) else min(focus, len(data))
    at = draw(st.integers(0, max(limit - 1, 0)))
    out = bytearray(data)
    if kind == "flip":
        out[at] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        del out[at:]
    elif kind == "extend":
        out += draw(st.binary(min_size=1, max_size=600))
    elif kind == "overwrite":
        chunk = draw(st.binary(min_size=1, max_size=16))
        out[at:at + len(chunk)] = chunk
    elif kind == "insert":
        out[at:at] = draw(st.binary(min_size=1, max_size=16))
    elif kind == "delete":
        del out[at:at + draw(st.integers(1, 16))]
    else:  # an interesting integer written over a field (8-aligned: most header fields are)
        at -= at % 8
        value = draw(st.sampled_from([0, 1, 63, 64, 512, 4096, (1 << 32) - 1, 1 << 32, (1 << 40) + 1,
                                      (1 << 62), (1 << 63), (1 << 64) - 1]))
        if at + 8 <= len(out):
            struct.pack_into("<Q", out, at, value)
    return bytes(out)


_json_leaves = (st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False)
                | st.text(max_size=20))
_json_values = st.recursive(_json_leaves, lambda children: st.lists(children, max_size=3)
                            | st.dictionaries(st.text(max_size=8), children, max_size=3), max_leaves=6)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += _paths(value, prefix + (i,))
    return found


@st.composite
def mutated_manifest_json(draw: st.DrawFn) -> bytes:
    """The base manifest with one member replaced, deleted or added, still valid JSON."""
    obj = json.loads(MANIFEST)
    path = draw(st.sampled_from(_paths(obj)[1:]))
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        parent[path[-1]] = draw(_json_values)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=8))] = draw(_json_values)
    else:
        parent.append(draw(_json_values))
    return json.dumps(obj, sort_keys=True, indent=2).encode()


# --- parsers --------------------------------------------------------------------------------------

@FUZZ
@given(st.one_of(mutated(MANIFEST), mutated_manifest_json()))
def test_parse_manifest_never_crashes(data: bytes) -> None:
    try:
        manifest = fmt.parse_manifest(data)
    except packer.PackerError as exc:
        event(type(exc).__name__)
        return
    assert fmt.parse_manifest(fmt.dump_manifest(manifest)) == manifest


@FUZZ
@given(mutated(SHARDS[0][:64], focus=64), st.one_of(st.none(), st.integers(0, 1 << 64)))
def test_shard_header_never_crashes(head: bytes, actual_size: int | None) -> None:
    try:
        header = fmt.ShardHeader.parse(head, actual_size=actual_size)
    except packer.PackerError:
        return
    assert fmt.ShardHeader.parse(header.encode()[:64]) == header


def _manifest_entries() -> tuple[list[fmt.ShardEntry], int]:
    manifest = fmt.parse_manifest(MANIFEST)
    return list(manifest.shards), manifest.alignment


@FUZZ
@given(mutated(INDEX, focus=64 + 64 * 13))
def test_index_parsers_never_crash(data: bytes) -> None:
    shards, alignment = _manifest_entries()
    try:
        rows, columns = fmt.parse_column_file(data, fmt.INDEX_MAGIC)
        fmt.validate_index(rows, columns, shards, alignment)
    except packer.PackerError as exc:
        event(type(exc).__name__)
        return
    # Accepted: it must round-trip like the manifest does (re-encoded, it parses to the same columns).
    again_rows, again = fmt.parse_column_file(b"".join(bytes(p) for p in fmt.encode_column_file(
        fmt.INDEX_MAGIC, rows, columns)), fmt.INDEX_MAGIC)
    assert again_rows == rows and list(again) == list(columns)
    assert all(np.array_equal(again[name], columns[name]) and again[name].dtype == columns[name].dtype
               for name in columns)


# --- whole datasets -------------------------------------------------------------------------------

def _rehash_index(folder: Path, data: bytes) -> None:
    """Write a mutated index under a fresh name and point the manifest at it, so the damage gets
    past the index checksum (R39) into the structural checks."""
    obj = json.loads((folder / "manifest.json").read_bytes())
    (folder / obj["index"]["path"]).unlink()
    digest = fmt.checksum(data)
    name = fmt.index_file_name(digest)
    (folder / name).write_bytes(data)
    obj["index"].update(path=name, size=len(data), checksum=fmt.checksum_hex(digest))
    (folder / "manifest.json").write_bytes(json.dumps(obj, sort_keys=True, indent=2).encode())


@st.composite
def damaged_dataset(draw: st.DrawFn) -> tuple[str, bytes, bool]:
    target = draw(st.sampled_from(["manifest", "manifest-json", "index", "shard0", "shard1"]))
    if target == "manifest":
        return target, draw(mutated(MANIFEST)), False
    if target == "manifest-json":
        return "manifest", draw(mutated_manifest_json()), False
    if target == "index":
        return target, draw(mutated(INDEX, focus=64 + 64 * 13)), draw(st.booleans())
    shard = SHARDS[int(target[-1])]
    return target, draw(mutated(shard, focus=64)), draw(st.booleans())


@FUZZ
@given(damaged_dataset(), st.sampled_from(["mmap", "pread"]))
def test_open_dataset_never_crashes(damage: tuple[str, bytes, bool], backend: str) -> None:
    target, data, fix_size = damage
    with tempfile.TemporaryDirectory(prefix="packer-fuzz-") as tmp:
        folder = Path(tmp) / "ds"
        shutil.copytree(BASE, folder, ignore=shutil.ignore_patterns("expected.json"))
        obj = json.loads(MANIFEST)
        if target == "manifest":
            (folder / "manifest.json").write_bytes(data)
        elif target == "index":
            if fix_size:
                _rehash_index(folder, data)
            else:
                (folder / obj["index"]["path"]).write_bytes(data)
        else:
            position = int(target[-1])
            (folder / obj["shards"][position]["path"]).write_bytes(data)
            if fix_size:  # the manifest agrees with the damaged file's size, so R20 lets it through
                obj["shards"][position]["size"] = len(data)
                (folder / "manifest.json").write_bytes(json.dumps(obj, sort_keys=True, indent=2).encode())
        try:
            with packer.open_dataset(folder, backend=backend, verify_checksums=True) as dataset:
                got = [dataset.read(i) for i in range(len(dataset))]
                batch = dataset.read_batch(np.arange(len(dataset)))
                got_batch = [bytes(batch[j]) for j in range(len(batch))]
        except packer.PackerError as exc:
            event(f"{target}: {type(exc).__name__}")
            return
        event(f"{target}: read back")
        assert got == SAMPLES and got_batch == SAMPLES
