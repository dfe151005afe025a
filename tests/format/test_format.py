"""Unit tests of packer/format.py: headers, column files, names, manifest, and offsets past 4 GiB."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import packer
from packer import format as fmt
from packer.errors import (
                           ChecksumMismatchError,
                           CorruptHeaderError,
                           IndexMismatchError,
                           ManifestError,
                           MisalignedRecordError,
                           NotAPackerFileError,
                           OffsetOutOfBoundsError,
                           OverlappingRecordsError,
                           PackerError,
                           TruncatedFileError,
                           UnsafePathError,
                           UnsupportedVersionError,
)

from helpers import TWO_SHARDS, index_columns

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "formats" / "vectors" / "valid" / "base-align512"


# --- spec and code agree ------------------------------------------------------------------------

def test_spec_requirements_match_code_tags() -> None:
    """Every reader requirement of SPEC.md is tagged [Rn] in the code, and every tag is specified."""
    spec = (REPO / "formats" / "SPEC.md").read_text("utf-8")
    specified = re.findall(r"^\| (R\d+) \|", spec, flags=re.M)
    assert len(specified) == len(set(specified)), "a requirement id appears twice in the tables"
    code = "".join((REPO / "packer" / name).read_text("utf-8") for name in ("format.py", "dataset.py", "place.py", "_internal/files.py"))
    tagged = set(re.findall(r"\[(R\d+)\]", code))
    assert set(specified) == tagged, (sorted(set(specified) - tagged), sorted(tagged - set(specified)))
    # the tiled-JPEG reader rules (section 13) live in packer/codecs/tiles.py
    tile_rules = set(re.findall(r"^\| (T\d+) \|", spec, flags=re.M))
    tile_tags = set(re.findall(r"\[(T\d+)\]", (REPO / "packer" / "codecs" / "tiles.py").read_text("utf-8")))
    assert tile_rules == tile_tags == {"T1", "T2", "T3"}, (tile_rules, tile_tags)


def test_all_names_resolve() -> None:
    for name in fmt.__all__:
        assert hasattr(fmt, name), name
    assert "verify_checksum" in fmt.__all__


# --- alignment and checksums ----------------------------------------------------------------------

@pytest.mark.parametrize("n, alignment, expected", [
    (0, 1, 0), (1, 1, 1), (63, 1, 63), (0, 4096, 0), (1, 4096, 4096), (4096, 4096, 4096),
    (4097, 4096, 8192), (64, 512, 512), (64, 64, 64), (65, 64, 128), ((1 << 62) - 1, 1 << 24, 1 << 62),
])
def test_align_up(n: int, alignment: int, expected: int) -> None:
    assert fmt.align_up(n, alignment) == expected


@pytest.mark.parametrize("alignment", [0, 3, 768, 1 << 25, -4096, True, 4096.0, "4096"])
def test_check_alignment_refuses(alignment: object) -> None:
    with pytest.raises(CorruptHeaderError, match="power of two"):
        fmt.check_alignment(alignment)


def test_checksum_hex_round_trip() -> None:
    value = fmt.checksum(b"packer")
    text = fmt.checksum_hex(value)
    assert len(text) == 16 and text == text.lower()
    assert fmt.parse_checksum_hex(text) == value
    assert fmt.checksum_hex(1) == "0000000000000001"
    for bad in (text.upper(), text[1:], text + "0", 12, None, "g" * 16):
        with pytest.raises(ManifestError, match="16 lowercase hex digits"):
            fmt.parse_checksum_hex(bad)


def test_verify_checksum() -> None:
    fmt.verify_checksum(b"abc", fmt.checksum(b"abc"))
    with pytest.raises(packer.ChecksumMismatchError, match="sample checksum mismatch") as caught:
        fmt.verify_checksum(b"abd", fmt.checksum(b"abc"), sample=3, offset=4096)
    assert caught.value.sample == 3 and caught.value.offset == 4096


def test_hasher_matches_checksum() -> None:
    hasher = fmt.Hasher()
    for piece in (b"a" * 100, memoryview(b"b" * 5000), np.arange(10, dtype=np.uint8)):
        hasher.update(piece)
    assert hasher.intdigest() == fmt.checksum(b"a" * 100 + b"b" * 5000 + bytes(range(10)))


# --- names ----------------------------------------------------------------------------------------

def test_file_names() -> None:
    assert fmt.shard_file_name(3, 0xABC) == "shards/shard-00003-0000000000000abc.pks"
    assert fmt.shard_file_name(123456, 1) == "shards/shard-123456-0000000000000001.pks"
    assert fmt.index_file_name(0xFF) == "index-00000000000000ff.pki"
    for number in (0, 7, 99999, 100000, 123456, fmt.MAX_SHARD_NUMBER):
        assert fmt.shard_number_of(fmt.shard_file_name(number, 5)) == number
    with pytest.raises(ValueError):
        fmt.shard_file_name(-1, 0)
    with pytest.raises(ValueError):
        fmt.shard_file_name(1 << 32, 0)


@pytest.mark.parametrize("path", [
    "shards/shard-0-0000000000000000.pks",          # fewer than 5 digits
    "shards/shard-000001-0000000000000000.pks",     # a leading zero beyond 5 digits
    "shards/shard-00001-000000000000000.pks",       # 15 hex digits
    "shards/shard-00001-000000000000000A.pks",      # upper case
    "shards/shard-00001-0000000000000000.pks.tmp",
    "shards/../shards/shard-00001-0000000000000000.pks",
    "/shards/shard-00001-0000000000000000.pks",
    "shard-00001-0000000000000000.pks",
    "shards/x/shard-00001-0000000000000000.pks",
    "shards/shard-12345678901-0000000000000000.pks",  # 11 digits
])
def test_shard_path_refused(path: str) -> None:
    with pytest.raises(UnsafePathError, match="not a valid dataset path"):
        fmt.shard_number_of(path)


# --- shard header ---------------------------------------------------------------------------------

@pytest.mark.parametrize("alignment", [1, 64, 512, 4096, 1 << 24])
def test_shard_header_round_trip(alignment: int) -> None:
    data_offset = fmt.align_up(64, alignment)
    header = fmt.ShardHeader(alignment=alignment, sample_count=5, file_size=fmt.align_up(data_offset + 100, alignment),
                             shard_number=42)
    region = header.encode()
    assert len(region) == data_offset == header.data_offset
    assert region[:8] == fmt.SHARD_MAGIC and region[44:] == bytes(len(region) - 44)
    assert struct.unpack_from("<8sIIQQQI", region) == (fmt.SHARD_MAGIC, 1, alignment, data_offset, 5,
                                                      header.file_size, 42)
    assert fmt.ShardHeader.parse(region[:64], actual_size=header.file_size) == header


def _header(**fields: int) -> bytearray:
    values = {"version": 1, "alignment": 512, "data_offset": 512, "count": 1, "file_size": 1024, "number": 0}
    values.update(fields)
    return bytearray(struct.pack("<8sIIQQQI20x", fmt.SHARD_MAGIC, values["version"], values["alignment"],
                                 values["data_offset"], values["count"], values["file_size"], values["number"]))


@pytest.mark.parametrize("head, actual, error, message", [
    (b"", None, NotAPackerFileError, "not a packer shard"),
    (b"PK", None, TruncatedFileError, "shorter than its 64-byte header"),
    (b"PKSHARD\x00\x01", None, TruncatedFileError, "shorter than its 64-byte header"),
    (b"version https://git-lfs", None, NotAPackerFileError, "starts with b'version "),
    (b"\x00" * 64, None, NotAPackerFileError, "not a packer shard"),
    (bytes(_header(version=2)), None, UnsupportedVersionError, "version 2 is not supported"),
    (bytes(_header(alignment=0)), None, CorruptHeaderError, "power of two"),
    (bytes(_header(alignment=1 << 25, data_offset=1 << 25)), None, CorruptHeaderError, "power of two"),
    (bytes(_header(data_offset=64)), None, CorruptHeaderError, "data_offset 64 must be 512"),
    (bytes(_header(count=0)), None, CorruptHeaderError, "sample_count 0 outside"),
    (bytes(_header(count=(1 << 40) + 1)), None, CorruptHeaderError, "outside 1..1099511627776"),
    (bytes(_header(file_size=512)), None, CorruptHeaderError, "hold at least one sample"),
    (bytes(_header(file_size=1000)), None, CorruptHeaderError, "multiple of 512"),
    (bytes(_header(file_size=1 << 62)), None, CorruptHeaderError, "below 2^62"),
    (bytes(_header()), 512, TruncatedFileError, "(truncated)"),
    (bytes(_header()), 1536, TruncatedFileError, "(extended)"),
])
def test_shard_header_refused(head: bytes, actual: int | None, error: type, message: str) -> None:
    with pytest.raises(error) as caught:
        fmt.ShardHeader.parse(head, path="x.pks", actual_size=actual)
    assert type(caught.value) is error and message in str(caught.value)


def test_shard_header_ignores_reserved_bytes() -> None:
    head = _header()
    head[50] = 7  # reserved: written as zero, not checked (a future field may use it)
    assert fmt.ShardHeader.parse(bytes(head)).sample_count == 1


# --- column files ---------------------------------------------------------------------------------

def _column_bytes(rows: int, columns: dict[str, np.ndarray], magic: bytes = fmt.INDEX_MAGIC) -> bytes:
    return b"".join(bytes(p) for p in fmt.encode_column_file(magic, rows, columns))


def test_column_file_round_trip() -> None:
    columns = {
        "a": np.arange(3, dtype=np.uint64), "b": np.array([-1, 0, 5], dtype=np.int64),
        "empty": np.zeros(0, dtype=np.uint32), "c": np.array([1, 2, 3], dtype=np.uint32),
        "bytes_": np.frombuffer(b"hello", dtype=np.uint8), "z9_": np.array([7], dtype=np.uint8),
    }
    data = _column_bytes(3, columns)
    assert len(data) % 64 == 0
    magic, version, header_size, file_size, rows, count = struct.unpack_from("<8sIIQQI", data)
    assert (magic, version, header_size, file_size, rows, count) == (fmt.INDEX_MAGIC, 1, 64 + 64 * 6, len(data), 3, 6)
    rows, parsed = fmt.parse_column_file(data, fmt.INDEX_MAGIC)
    assert rows == 3 and list(parsed) == list(columns)
    previous_end = header_size
    for i, (name, array) in enumerate(columns.items()):
        assert parsed[name].dtype == array.dtype and np.array_equal(parsed[name], array)
        offset = struct.unpack_from("<Q", data, 64 + 64 * i + 32)[0]
        assert offset == fmt.align_up(previous_end, 64)  # writers pack columns tightly (§4.3)
        previous_end = offset + array.nbytes
    assert data[previous_end:] == bytes(len(data) - previous_end)
    # numpy views, no copy
    assert not parsed["a"].flags.owndata


def test_column_file_plan_magic_is_distinct() -> None:
    data = _column_bytes(1, {"x": np.zeros(1, np.uint8)}, fmt.PLAN_MAGIC)
    with pytest.raises(NotAPackerFileError, match="starts with b'PKPLAN"):
        fmt.parse_column_file(data, fmt.INDEX_MAGIC)
    assert fmt.parse_column_file(data, fmt.PLAN_MAGIC, kind="plan")[0] == 1


@pytest.mark.parametrize("name", ["", "Label", "9lives", "a-b", "a b", "\u00e9t\u00e9", "x" * 25, b"bytes"])
def test_encode_column_file_refuses_bad_names(name: object) -> None:
    with pytest.raises(ValueError, match="column name"):
        fmt.encode_column_file(fmt.INDEX_MAGIC, 1, {name: np.zeros(1, np.uint8)})  # type: ignore[dict-item]


def test_encode_column_file_accepts_24_byte_name() -> None:
    name = "a" * 24
    rows, parsed = fmt.parse_column_file(_column_bytes(1, {name: np.zeros(1, np.uint8)}), fmt.INDEX_MAGIC)
    assert list(parsed) == [name]


@pytest.mark.parametrize("columns, rows", [
    ({}, 0),
    ({f"c{i}": np.zeros(1, np.uint8) for i in range(65)}, 1),
    ({"f": np.zeros(1, np.float64)}, 1),
    ({"m": np.zeros((2, 2), np.uint8)}, 2),
    ({"i": np.zeros(1, np.int32)}, 1),
    ({"a": np.zeros(1, np.uint8)}, -1),
    ({"a": np.zeros(1, np.uint8)}, (1 << 40) + 1),
])
def test_encode_column_file_refuses(columns: dict[str, np.ndarray], rows: int) -> None:
    with pytest.raises(ValueError):
        fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns)


def test_column_file_big_endian_input_is_refused() -> None:
    with pytest.raises(ValueError):
        fmt.encode_column_file(fmt.INDEX_MAGIC, 1, {"a": np.zeros(1, dtype=">u8")})


def _patched(data: bytes, at: int, fmt_char: str, value: object) -> bytes:
    out = bytearray(data)
    struct.pack_into("<" + fmt_char, out, at, value)
    return bytes(out)


def test_column_file_refusals() -> None:
    data = _column_bytes(2, {"a": np.arange(2, dtype=np.uint64), "b": np.arange(2, dtype=np.uint8)})
    cases = [
        (data[:10], TruncatedFileError, "shorter than its 64-byte header"),
        (b"", NotAPackerFileError, "not a packer index file"),
        (data + bytes(64), TruncatedFileError, "(extended)"),
        (data[:-64], TruncatedFileError, "(truncated)"),
        (_patched(data, 8, "I", 9), UnsupportedVersionError, "version 9"),
        (_patched(data, 32, "I", 65), CorruptHeaderError, "column_count 65"),
        (_patched(data, 12, "I", 64), CorruptHeaderError, "header_size 64"),
        (_patched(data, 24, "Q", (1 << 40) + 1), CorruptHeaderError, "row_count"),
        (_patched(data, 64 + 64 + 0, "24s", b"a"), CorruptHeaderError, "repeated name 'a'"),
        (_patched(data, 64, "24s", b"\xff"), CorruptHeaderError, "non-ASCII name"),
        (_patched(data, 64 + 24, "8s", b"\xff\xfe"), CorruptHeaderError, "unsupported dtype"),
        (_patched(data, 64 + 32, "Q", 200), OverlappingRecordsError, "multiple of 64"),
        (_patched(data, 64 + 64 + 32, "Q", 64), OverlappingRecordsError, "at or after"),
        (_patched(data, 64 + 40, "Q", (1 << 64) - 1), OffsetOutOfBoundsError, "runs past the end"),
    ]
    for buf, error, message in cases:
        with pytest.raises(error) as caught:
            fmt.parse_column_file(buf, fmt.INDEX_MAGIC)
        assert type(caught.value) is error and message in str(caught.value), (message, str(caught.value))


# --- manifest -------------------------------------------------------------------------------------

def _base_manifest() -> dict:
    return json.loads((BASE / "manifest.json").read_bytes())


def _dump(obj: object) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def test_manifest_round_trip_is_canonical() -> None:
    data = (BASE / "manifest.json").read_bytes()
    manifest = fmt.parse_manifest(data)
    assert fmt.dump_manifest(manifest) == data
    assert [s.number for s in manifest.shards] == [0, 1]


def test_dump_manifest_keeps_unknown_top_level_members() -> None:
    obj = _base_manifest()
    obj["x_future"] = {"b": 1, "a": [1, 2]}
    obj["sample_count"] = 3
    manifest = fmt.parse_manifest(_dump(obj))
    changed = dataclasses.replace(manifest, created_by="packer 9.9", history=({"op": "append"},))
    out = json.loads(fmt.dump_manifest(changed))
    assert out["x_future"] == {"b": 1, "a": [1, 2]}
    assert out["created_by"] == "packer 9.9" and out["history"] == [{"op": "append"}]
    assert fmt.parse_manifest(fmt.dump_manifest(changed)) == changed


def test_dump_manifest_writes_known_fields_from_the_typed_values() -> None:
    manifest = fmt.parse_manifest((BASE / "manifest.json").read_bytes())
    stale = dataclasses.replace(manifest, raw={**manifest.raw, "format": "other", "sample_count": 99})
    out = json.loads(fmt.dump_manifest(stale))
    assert out["format"] == fmt.FORMAT_NAME and out["sample_count"] == manifest.sample_count


def test_dump_manifest_refuses_nan_in_normative_fields_and_nulls_it_in_informational_ones() -> None:
    """A NaN codec parameter is a writer bug (refused); a 1e400 in an edited ``build`` field is
    informational and must not make ``append`` fail: it is written as null (strict JSON)."""
    manifest = fmt.parse_manifest((BASE / "manifest.json").read_bytes())
    with pytest.raises(ValueError):
        fmt.dump_manifest(dataclasses.replace(manifest, codec={"name": "passthrough", "x": float("nan")}))
    edited = dataclasses.replace(manifest, build={"x": float("inf"), "y": [float("nan"), 1.5]},
                                 history=({"z": float("-inf")},))
    def refuse(name: str) -> None:
        raise ValueError(name)
    out = json.loads(fmt.dump_manifest(edited), parse_constant=refuse)
    assert out["build"] == {"x": None, "y": [None, 1.5]} and out["history"] == [{"z": None}]


def test_manifest_size_cap() -> None:
    """[R30] checked on the byte count, before any parsing."""
    data = b"{" + b" " * fmt.MAX_MANIFEST_BYTES + b"}"
    with pytest.raises(ManifestError, match="over the 67108864 limit"):
        fmt.parse_manifest(data)


def test_manifest_shard_count_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """[R36] checked before any entry (the real cap, 2^24, would need a 48 MB manifest)."""
    obj = _base_manifest()
    obj["shards"] = [None] * 3
    monkeypatch.setattr(fmt, "MAX_SHARDS", 2)
    with pytest.raises(ManifestError, match="lists 3 shards, over the 2 limit"):
        fmt.parse_manifest(_dump(obj))


@pytest.mark.parametrize("change, error, message", [
    (lambda m: m.update(shards=[]), ManifestError, "differs from the sum"),
    (lambda m: m["index"].update(size=0), ManifestError, "field 'size' = 0 outside 1.."),
    (lambda m: m["shards"][1].update(path="shards/shard-4294967296-" + "0" * 16 + ".pks"), ManifestError,
     "over the u32 limit"),
    (lambda m: m["shards"][1].update(path=m["shards"][0]["path"]), ManifestError, "not numbered after"),
    (lambda m: m["shards"][0].update(sample_count=0), ManifestError, "outside 1.."),
    (lambda m: m.update(shards={}), ManifestError, "must be an array, got an object"),
    (lambda m: m["shards"].__setitem__(0, [1]), ManifestError, "shard 0 must be an object"),
    (lambda m: m["codec"].pop("name"), ManifestError, "lacks required field 'name'"),
    (lambda m: m.update(alignment=4096.0), ManifestError, "got a number with a fraction"),
    (lambda m: m.update(created_by=1), ManifestError, "'created_by' must be a string"),
    (lambda m: m.update(build=[]), ManifestError, "'build' must be an object"),
    (lambda m: m["index"].update(path="index-" + "0" * 16 + ".pki/../x"), UnsafePathError, "index path"),
    (lambda m: m.pop("format"), NotAPackerFileError, "manifest format is None"),
    (lambda m: m.pop("checksum_algorithm"), ManifestError, "lacks required field 'checksum_algorithm'"),
])
def test_manifest_refusals(change, error: type, message: str) -> None:
    obj = _base_manifest()
    change(obj)
    with pytest.raises(error) as caught:
        fmt.parse_manifest(_dump(obj))
    assert type(caught.value) is error and message in str(caught.value), str(caught.value)


@pytest.mark.parametrize("data, error", [
    (b"", NotAPackerFileError), (b"[1, 2]", NotAPackerFileError), (b"\xef\xbb\xbf{}", NotAPackerFileError),
    (b"{", ManifestError), (b'{"a": Infinity}', ManifestError), (b"\x0b{}", ManifestError),
    (b"{" * 100000 + b"}" * 100000, ManifestError), (b'{"format": "packer-dataset"}', ManifestError),
])
def test_manifest_not_json(data: bytes, error: type) -> None:
    with pytest.raises(error):
        fmt.parse_manifest(data)


def test_manifest_gap_in_numbers_is_valid() -> None:
    obj = _base_manifest()
    path = obj["shards"][1]["path"]
    obj["shards"][1]["path"] = path.replace("shard-00001-", "shard-00007-")
    assert [s.number for s in fmt.parse_manifest(_dump(obj)).shards] == [0, 7]


# --- index ----------------------------------------------------------------------------------------

def test_validate_index_empty() -> None:
    empty64, empty8 = np.zeros(0, np.uint64), np.zeros(0, np.uint8)
    columns = {"shard": np.zeros(0, np.uint32), "offset": empty64, "size": empty64, "checksum": empty64,
               "label": np.zeros(0, np.int64), "width": np.zeros(0, np.uint32), "height": np.zeros(0, np.uint32),
               "channels": empty8, "image_format": empty8, "key_offsets": np.zeros(1, np.uint64), "keys": empty8,
               "meta_offsets": np.zeros(1, np.uint64), "meta": empty8}
    rows, parsed = fmt.parse_column_file(_column_bytes(0, columns), fmt.INDEX_MAGIC)
    assert len(fmt.validate_index(rows, parsed, [], 4096)) == 0


# --- offsets past 4 GiB (sparse files) --------------------------------------------------------------

def test_offsets_past_4_gib(tmp_path: Path) -> None:
    """A hand-made dataset whose second sample starts past 2^32 in a sparse shard of ~4 GiB."""
    alignment = 4096
    first_size = (1 << 32) + 100  # one huge (sparse, all-zero) sample pushes the next past 4 GiB
    second = bytes(range(256)) * 4 + b"tail"
    offsets = [fmt.shard_data_offset(alignment)]
    offsets.append(fmt.align_up(offsets[0] + first_size, alignment))
    file_size = fmt.align_up(offsets[1] + len(second), alignment)
    assert offsets[1] > 1 << 32

    folder = tmp_path / "big"
    (folder / "shards").mkdir(parents=True)
    shard_name = fmt.shard_file_name(0, 0)  # the whole-file hash is not checked at open
    shard_path = folder / shard_name
    with open(shard_path, "wb") as handle:
        handle.write(fmt.ShardHeader(alignment=alignment, sample_count=2, file_size=file_size,
                                     shard_number=0).encode())
        handle.write(b"head of the huge sample")
        handle.seek(offsets[1])
        handle.write(second)
    os.truncate(shard_path, file_size)
    if os.stat(shard_path).st_blocks * 512 > 64 << 20:
        pytest.skip("this file system does not store sparse files")

    columns = {
        "shard": np.zeros(2, np.uint32), "offset": np.array(offsets, np.uint64),
        "size": np.array([first_size, len(second)], np.uint64),
        "checksum": np.array([0, fmt.checksum(second)], np.uint64),
        "label": np.array([-1, -1], np.int64), "width": np.zeros(2, np.uint32), "height": np.zeros(2, np.uint32),
        "channels": np.zeros(2, np.uint8), "image_format": np.zeros(2, np.uint8),
        "key_offsets": np.array([0, 3, 6], np.uint64), "keys": np.frombuffer(b"bigsml", np.uint8),
        "meta_offsets": np.zeros(3, np.uint64), "meta": np.zeros(0, np.uint8),
    }
    index_bytes = _column_bytes(2, columns)
    index_name = fmt.index_file_name(fmt.checksum(index_bytes))
    (folder / index_name).write_bytes(index_bytes)
    manifest = fmt.Manifest(
        sample_count=2, alignment=alignment, codec={"name": "passthrough"}, classes=(),
        index=fmt.FileEntry(path=index_name, size=len(index_bytes), checksum=fmt.checksum(index_bytes)),
        shards=(fmt.ShardEntry(path=shard_name, size=file_size, checksum=0, sample_count=2),),
        build={}, history=(), created_by="tests/format/test_format.py")
    (folder / fmt.MANIFEST_NAME).write_bytes(fmt.dump_manifest(manifest))

    for backend in ("mmap", "pread"):
        with packer.open_dataset(folder, backend=backend) as dataset:
            info = dataset.sample_info(1)
            assert info["offset"] == offsets[1] > 1 << 32 and info["key"] == "sml"
            assert dataset.read(1) == second
            assert dataset.read_batch([1]).data.tobytes()[:len(second)] == second
            dataset.verify_checksums = True
            assert bytes(dataset.get(1)) == second


# --- format ---------------------------------------------------------------------------------------


WHERE = "/data/ds/shards/shard-00000-0000000000000000.pks"


def header_bytes(**fields: int) -> bytes:
    values = {"version": 1, "alignment": 4096, "data_offset": 4096, "count": 3, "file_size": 3 * 4096,
              "number": 0, **fields}
    return struct.pack("<8sIIQQQI20x", fields.get("magic", fmt.SHARD_MAGIC), values["version"], values["alignment"],
                       values["data_offset"], values["count"], values["file_size"], values["number"])


SHARD_HEADER_CASES = [
    (b"", NotAPackerFileError, "not a packer shard (starts with b'')"),
    (b"junkjunkjunkjunkjunk", NotAPackerFileError, "not a packer shard (starts with b'junkjunk')"),
    (fmt.SHARD_MAGIC + b"\x01\x00", TruncatedFileError, "shard is 10 bytes, shorter than its 64-byte header"),
    (header_bytes(magic=b"PKINDEX\x00"), NotAPackerFileError, "not a packer shard (starts with b'PKINDEX\\x00')"),
    (header_bytes(version=2), UnsupportedVersionError,
     "shard format version 2 is not supported (this reader accepts [1]); upgrade packer"),
    (header_bytes(alignment=3), CorruptHeaderError, "alignment must be a power of two between 1 and 16777216, got 3"),
    (header_bytes(data_offset=64), CorruptHeaderError, "data_offset 64 must be 4096 for alignment 4096"),
    (header_bytes(count=0), CorruptHeaderError, f"sample_count 0 outside 1..{fmt.MAX_SAMPLES}"),
    (header_bytes(count=fmt.MAX_SAMPLES + 1), CorruptHeaderError,
     f"sample_count {fmt.MAX_SAMPLES + 1} outside 1..{fmt.MAX_SAMPLES}"),
    (header_bytes(file_size=4096), CorruptHeaderError,
     "file_size 4096 must be a multiple of 4096, hold at least one sample and be below 2^62"),
    (header_bytes(file_size=3 * 4096 + 1), CorruptHeaderError,
     "file_size 12289 must be a multiple of 4096, hold at least one sample and be below 2^62"),
    (header_bytes(alignment=1, data_offset=64, file_size=64), CorruptHeaderError,
     "file_size 64 must be a multiple of 1, hold at least one sample and be below 2^62"),
    (header_bytes(alignment=1, data_offset=64, file_size=fmt.MAX_FILE_SIZE + 1), CorruptHeaderError,
     f"file_size {fmt.MAX_FILE_SIZE + 1} must be a multiple of 1, hold at least one sample and be below 2^62"),
]


@pytest.mark.parametrize("head, error, message", SHARD_HEADER_CASES,
                         ids=[f"case{i}" for i in range(len(SHARD_HEADER_CASES))])
def test_shard_header_errors_are_exact_and_name_the_file(head: bytes, error: type, message: str) -> None:
    with pytest.raises(error) as caught:
        fmt.ShardHeader.parse(head, path=WHERE)
    assert type(caught.value) is error
    assert caught.value.message == message and caught.value.path == WHERE


def test_shard_header_size_on_disk_and_limits() -> None:
    for actual, word in ((2 * 4096, "truncated"), (4 * 4096, "extended")):
        with pytest.raises(TruncatedFileError) as caught:
            fmt.ShardHeader.parse(header_bytes(), path=WHERE, actual_size=actual)
        assert caught.value.message == f"shard is {actual} bytes on disk but its header says 12288 ({word})"
        assert caught.value.path == WHERE
    # the largest values each rule allows are accepted
    top = fmt.ShardHeader.parse(header_bytes(alignment=1, data_offset=64, count=fmt.MAX_SAMPLES,
                                             file_size=fmt.MAX_FILE_SIZE, number=7))
    assert (top.alignment, top.sample_count, top.file_size, top.shard_number) == (1, fmt.MAX_SAMPLES,
                                                                                   fmt.MAX_FILE_SIZE, 7)
    smallest = fmt.ShardHeader.parse(header_bytes(alignment=1, data_offset=64, count=1, file_size=65))
    assert smallest.file_size == 65 and smallest.version == 1
    assert fmt.ShardHeader.parse(header_bytes(), actual_size=12288).encode()[:64] == header_bytes()


def manifest_dict(**changes: Any) -> dict[str, Any]:
    shard = {"path": "shards/shard-00000-00000000000000aa.pks", "size": 8192, "checksum": "00000000000000bb",
             "sample_count": 2}
    base: dict[str, Any] = {
        "format": "packer-dataset", "format_version": 1, "checksum_algorithm": "xxh3_64", "alignment": 4096,
        "sample_count": 2, "codec": {"name": "passthrough"}, "classes": ["a"],
        "index": {"path": "index-00000000000000cc.pki", "size": 100, "checksum": "00000000000000dd"},
        "shards": [shard], "created_by": "test"}
    base.update(changes)
    return base


MANIFEST_PATH = "/data/ds/manifest.json"


def manifest_error(obj: Any) -> Any:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    with pytest.raises(PackerError) as caught:
        fmt.parse_manifest(data, path=MANIFEST_PATH)
    assert caught.value.path == MANIFEST_PATH, "every manifest error names the manifest"
    return caught.value


def test_manifest_errors_are_exact() -> None:
    junk = manifest_error(b"PK\x03\x04 this is a zip file")
    assert isinstance(junk, NotAPackerFileError)
    assert junk.message == "not a packer manifest (starts with b'PK\\x03\\x04 this is a z')"
    null = manifest_error(manifest_dict(format_version=None))
    assert null.message == "manifest field 'format_version' must be an integer, got null"
    assert manifest_error(manifest_dict(alignment=True)).message == \
        "manifest field 'alignment' must be an integer, got a boolean"
    missing = manifest_dict()
    del missing["checksum_algorithm"]
    assert manifest_error(missing).message == "manifest lacks required field 'checksum_algorithm'"
    assert manifest_error(manifest_dict(sample_count=-1)).message == \
        f"manifest field 'sample_count' = -1 outside 0..{fmt.MAX_SAMPLES}"
    bad_index = manifest_dict(index={"path": "index-00000000000000cc.pki", "size": 100, "checksum": "DD"})
    assert manifest_error(bad_index).message == "index checksum must be 16 lowercase hex digits, got 'DD'"
    bad_path = manifest_dict(index={"path": "index.pki", "size": 100, "checksum": "00000000000000dd"})
    error = manifest_error(bad_path)
    assert isinstance(error, UnsafePathError)
    assert error.message == ("index path 'index.pki' is not a valid dataset path (expected "
                             "index-<16 hex digits>.pki, relative, inside the dataset)")
    shard = dict(manifest_dict()["shards"][0], path="shards/x.pks")
    assert manifest_error(manifest_dict(shards=[shard])).message == (
        "shard 0 path 'shards/x.pks' is not a valid dataset path (expected "
        "shards/shard-<number, at least 5 digits>-<16 hex digits>.pks, relative, inside the dataset)")


def test_manifest_limits_are_inclusive() -> None:
    shard = dict(manifest_dict()["shards"][0], sample_count=fmt.MAX_SAMPLES)
    parsed = fmt.parse_manifest(json.dumps(manifest_dict(sample_count=fmt.MAX_SAMPLES, shards=[shard])).encode())
    assert parsed.sample_count == fmt.MAX_SAMPLES
    # exactly the size limit is not "over the limit" (it fails later, for its content)
    at_limit = b"{" + b" " * (fmt.MAX_MANIFEST_BYTES - 2) + b"}"
    error = manifest_error(at_limit)
    assert "limit" not in error.message and "format is None" in error.message
    over = manifest_error(at_limit + b" ")
    assert over.message == f"manifest is {fmt.MAX_MANIFEST_BYTES + 1} bytes, over the {fmt.MAX_MANIFEST_BYTES} limit"


def test_relative_paths() -> None:
    anything = re.compile(r".*")
    for text in ("a/../b", ".."):
        with pytest.raises(UnsafePathError):
            fmt.check_relative_path(text, anything, what="x")
    with pytest.raises(UnsafePathError) as caught:
        fmt.check_relative_path(12, anything, what="thing", path=MANIFEST_PATH)
    assert caught.value.message == ("thing 12 is not a valid dataset path (expected .*, relative, inside the "
                                    "dataset)") and caught.value.path == MANIFEST_PATH
    assert fmt.check_relative_path("a/b", anything, what="x") == "a/b"
    with pytest.raises(UnsafePathError, match="^shard path 5 is not a valid dataset path"):
        fmt.shard_number_of(5)  # type: ignore[arg-type]
    assert fmt.shard_number_of("shards/shard-00012-00000000000000aa.pks") == 12


def test_checksum_helpers() -> None:
    with pytest.raises(ManifestError) as caught:
        fmt.parse_checksum_hex("abc", path=MANIFEST_PATH)
    assert caught.value.message == "checksum must be 16 lowercase hex digits, got 'abc'"
    assert caught.value.path == MANIFEST_PATH
    with pytest.raises(ChecksumMismatchError) as mismatch:
        fmt.verify_checksum(b"abc", 0, path=WHERE, sample=4, offset=8192)
    assert (mismatch.value.path, mismatch.value.sample, mismatch.value.offset) == (WHERE, 4, 8192)
    fmt.verify_checksum(b"abc", fmt.checksum(b"abc"))


@pytest.mark.parametrize("alignment", [1, 2, 64, 4096])
def test_align_up_array_matches_align_up(alignment: int) -> None:
    values = [0, 1, 2, 63, 64, 65, 4095, 4096, 4097, 123457]
    for dtype in (np.uint64, np.int64):
        got = fmt.align_up_array(np.array(values, dtype=dtype), alignment)
        assert got.dtype == dtype
        assert got.tolist() == [fmt.align_up(v, alignment) for v in values]


# --- format: the index table and the column-file writer -------------------------------------------


INDEX_PATH = "/data/ds/index-00000000000000cc.pki"


INDEX_CASES = [
    ({"shard": [0, 0, 2]}, OffsetOutOfBoundsError, "names shard 2 but the manifest lists 2", 2),
    ({"shard": [0, 2, 2]}, OffsetOutOfBoundsError, "names shard 2 but the manifest lists 2", 1),
    ({"shard": [0, 1, 1]}, OverlappingRecordsError,
     "is in shard 1 but the manifest's per-shard counts place it in shard 0", 1),
    ({"size": [100, 0, 10]}, CorruptHeaderError, "has size 0; every sample holds at least one byte", 1),
    ({"offset": [4096, 8193, 4096]}, MisalignedRecordError, "starts at 8193, not a multiple of 4096", 1),
    ({"offset": [4096, 8192, 4097]}, MisalignedRecordError, "starts at 4097, not a multiple of 4096", 2),
    ({"size": [100, 2**62, 10]}, OffsetOutOfBoundsError, "has an offset or size beyond 2^62", 1),
    ({"offset": [4096, 2**62, 4096]}, OffsetOutOfBoundsError, "has an offset or size beyond 2^62", 1),
    ({"offset": [4096, 12288, 4096]}, OverlappingRecordsError,
     "starts at 12288 but the layout requires 8192 (samples must be packed in order at aligned offsets "
     "without overlap or gaps)", 1),
    ({"size": [100, 9000, 10]}, OffsetOutOfBoundsError,
     "shard 0 (shards/shard-00000-00000000000000aa.pks) is 16384 bytes but its samples end at 20480", 1),
    ({"size": [100, 5000, 5000]}, OffsetOutOfBoundsError,
     "shard 1 (shards/shard-00001-00000000000000bb.pks) is 8192 bytes but its samples end at 12288", 2),
    ({"key_offsets": [0, 1, 2, 4]}, OverlappingRecordsError,
     "index column 'key_offsets' must start at 0, never decrease and end at the 'keys' length 3", None),
    ({"key_offsets": [0, 2, 1, 3]}, OverlappingRecordsError,
     "index column 'key_offsets' must start at 0, never decrease and end at the 'keys' length 3", None),
    ({"meta_offsets": [1, 1, 1, 1], "meta": [7]}, OverlappingRecordsError,
     "index column 'meta_offsets' must start at 0, never decrease and end at the 'meta' length 1", None),
    ({"label": np.array([0, 1, 0], dtype="<u8")}, CorruptHeaderError,
     "index column 'label' has dtype <u8, expected <i8", None),
    ({"width": np.array([1, 2], dtype="<u4")}, IndexMismatchError,
     "index column 'width' has 2 entries, expected 3", None),
    ({"meta_offsets": [0, 0, 0]}, IndexMismatchError, "index column 'meta_offsets' has 3 entries, expected 4", None),
]


@pytest.mark.parametrize("changes, error, message, sample", INDEX_CASES, ids=[f"case{i}" for i in range(len(INDEX_CASES))])
def test_index_errors_name_the_file_and_sample(changes: dict[str, Any], error: type, message: str,
                                               sample: int | None) -> None:
    with pytest.raises(error) as caught:
        fmt.validate_index(3, index_columns(**changes), TWO_SHARDS, 4096, path=INDEX_PATH)
    assert type(caught.value) is error
    assert (caught.value.message, caught.value.path, caught.value.sample) == (message, INDEX_PATH, sample)


def test_index_structure_errors() -> None:
    columns = index_columns()
    del columns["meta"]
    with pytest.raises(CorruptHeaderError) as caught:
        fmt.validate_index(3, columns, TWO_SHARDS, 4096, path=INDEX_PATH)
    assert (caught.value.message, caught.value.path) == ("index lacks required column 'meta'", INDEX_PATH)
    with pytest.raises(IndexMismatchError) as mismatch:
        fmt.validate_index(3, index_columns(), TWO_SHARDS[:1], 4096, path=INDEX_PATH)
    assert (mismatch.value.message, mismatch.value.path) == (
        "index holds 3 samples but the manifest's shards hold 2", INDEX_PATH)
    ix = fmt.validate_index(3, index_columns(), TWO_SHARDS, 4096, path=INDEX_PATH)
    assert len(ix) == 3 and ix.size.tolist() == [100, 5000, 10]
    # alignment 1: any offset is aligned, payloads packed back to back after the 64-byte header
    tight = index_columns(offset=[64, 164, 64], size=[100, 50, 1])  # a 1-byte sample is a sample
    shards = [fmt.ShardEntry(TWO_SHARDS[0].path, 214, 1, 2), fmt.ShardEntry(TWO_SHARDS[1].path, 65, 2, 1)]
    assert fmt.validate_index(3, tight, shards, 1).offset.tolist() == [64, 164, 64]
    # offsets past 2^53 are checked exactly (no float rounding): one sample of 2^60 + 1 bytes
    big = (1 << 60) + 1
    huge_shards = [fmt.ShardEntry(TWO_SHARDS[0].path, 64 + big + 1, 1, 2), fmt.ShardEntry(TWO_SHARDS[1].path, 65, 2, 1)]
    huge_index = index_columns(offset=[64, 64 + big, 64], size=[big, 1, 1])
    assert fmt.validate_index(3, huge_index, huge_shards, 1).offset.tolist() == [64, 64 + big, 64]
    with pytest.raises(OverlappingRecordsError):  # one byte off at 2^60 is still off
        fmt.validate_index(3, index_columns(offset=[64, 65 + big, 64], size=[big, 1, 1]), huge_shards, 1)
    # a size just below 2^62 is not "beyond 2^62": the layout check refuses it instead
    with pytest.raises(OffsetOutOfBoundsError) as caught:
        fmt.validate_index(3, index_columns(size=[100, fmt.MAX_FILE_SIZE - 1, 10]), TWO_SHARDS, 4096)
    assert caught.value.message.startswith("shard 0 (")
    # alignment 2: an odd offset is misaligned
    with pytest.raises(MisalignedRecordError):
        fmt.validate_index(3, index_columns(offset=[64, 165, 64], size=[101, 50, 10]),
                           [fmt.ShardEntry(TWO_SHARDS[0].path, 216, 1, 2), fmt.ShardEntry(TWO_SHARDS[1].path, 74, 2, 1)], 2)
    # the largest offset and size below 2^62 are not "beyond" it
    huge = fmt.MAX_FILE_SIZE - 4095  # a multiple of 4096 below 2^62
    with pytest.raises(OverlappingRecordsError):  # refused for layout, not for the 2^62 bound
        fmt.validate_index(3, index_columns(offset=[4096, huge, 4096]), TWO_SHARDS, 4096)
    empty = {name: np.zeros(1 if rule == "N+1" else 0, dtype=typestr) for name, (typestr, rule) in fmt.INDEX_COLUMNS.items()}
    assert len(fmt.validate_index(0, empty, [], 4096)) == 0


def test_column_file_writer_limits_and_layout() -> None:
    one = {"a": np.arange(3, dtype="<u8")}
    with pytest.raises(ValueError, match=f"^a column file holds 1..{fmt.MAX_COLUMNS} columns, got 0$"):
        fmt.encode_column_file(fmt.INDEX_MAGIC, 0, {})
    many = {f"c{i}": np.zeros(1, dtype="|u1") for i in range(fmt.MAX_COLUMNS)}
    assert fmt.parse_column_file(b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, 1, many)),
                                 fmt.INDEX_MAGIC)[1].keys() == many.keys()
    with pytest.raises(ValueError, match="^magic must be 8 bytes, got b'PK'$"):
        fmt.encode_column_file(b"PK", 0, one)
    with pytest.raises(ValueError, match=f"^row_count -1 outside 0..{fmt.MAX_SAMPLES}$"):
        fmt.encode_column_file(fmt.INDEX_MAGIC, -1, one)
    fmt.encode_column_file(fmt.INDEX_MAGIC, fmt.MAX_SAMPLES, one)
    with pytest.raises(ValueError, match=r"^column 'a': need a 1-D array of \['<i8', '<u4', '<u8', '\|u1'\], got <f8$"):
        fmt.encode_column_file(fmt.INDEX_MAGIC, 0, {"a": np.zeros(2)})
    pieces = fmt.encode_column_file(fmt.PLAN_MAGIC, 3, {"a": np.arange(3, dtype="<u8"), "b": np.arange(3, dtype="|u1")})
    data = b"".join(bytes(p) for p in pieces)
    # header 64 + 2 entries of 64 = 192: already 64-aligned, so no padding piece before the first column;
    # 24 bytes of "a" then padding to 256, 3 bytes of "b" then padding to 320
    assert [len(bytes(p)) for p in pieces] == [192, 24, 40, 3, 61]
    assert len(data) == 320
    rows, columns = fmt.parse_column_file(data, fmt.PLAN_MAGIC)
    assert rows == 3 and columns["a"].tolist() == [0, 1, 2] and columns["b"].tolist() == [0, 1, 2]
    exact = fmt.encode_column_file(fmt.PLAN_MAGIC, 8, {"a": np.arange(8, dtype="<u8")})
    assert [len(bytes(p)) for p in exact] == [128, 64], "no zero-length padding pieces"


def test_manifest_dump_is_utf8_and_refuses_nan() -> None:
    manifest = fmt.parse_manifest(json.dumps(manifest_dict(classes=["café"])).encode())
    text = fmt.dump_manifest(manifest)
    assert "café".encode("utf-8") in text and b"\\u00e9" not in text
    informational = fmt.Manifest(**{**manifest.__dict__, "build": {"x": float("nan")}})
    assert b'"x": null' in fmt.dump_manifest(informational)  # informational fields: strict JSON, never NaN
    bad = fmt.Manifest(**{**manifest.__dict__, "codec": {"name": "passthrough", "x": float("nan")}})
    with pytest.raises(ValueError):
        fmt.dump_manifest(bad)
    with pytest.raises(ValueError, match=f"^shard number -1 outside 0..{fmt.MAX_SHARD_NUMBER}$"):
        fmt.shard_file_name(-1, 0)


def shard_item(number: int = 0, **changes: Any) -> dict[str, Any]:
    return {"path": f"shards/shard-{number:05d}-00000000000000aa.pks", "size": 8192, "checksum": "00000000000000bb",
            "sample_count": 2, **changes}


MANIFEST_CASES: list[tuple[Any, str]] = [
    (b"{\"a\": NaN}", "manifest is not valid UTF-8 JSON: NaN is not valid JSON"),
    (manifest_dict(format_version=2), "dataset format version 2 is not supported (this reader accepts [1]); upgrade packer"),
    (manifest_dict(checksum_algorithm="crc32"), "checksum_algorithm 'crc32' is not 'xxh3_64'"),
    (manifest_dict(alignment=3), "alignment must be a power of two between 1 and 16777216, got 3"),
    (manifest_dict(classes=["a", 1]), "manifest classes must all be strings"),
    (manifest_dict(sample_count="2"), "manifest field 'sample_count' must be an integer, got a string"),
    (manifest_dict(codec=[]), "manifest field 'codec' must be an object, got an array"),
    (manifest_dict(codec={}), "manifest codec lacks required field 'name'"),
    (manifest_dict(classes="ab"), "manifest field 'classes' must be an array, got a string"),
    (manifest_dict(index=1.5), "manifest field 'index' must be an object, got a number with a fraction or exponent"),
    (manifest_dict(index={"size": 100, "checksum": "00000000000000dd"}), "manifest index lacks required field 'path'"),
    (manifest_dict(shards={}), "manifest field 'shards' must be an array, got an object"),
    (manifest_dict(shards=[{"size": 8192}]), "manifest shard 0 lacks required field 'path'"),
    (manifest_dict(index={"path": "index-00000000000000cc.pki", "size": 0, "checksum": "00000000000000dd"}),
     f"manifest index field 'size' = 0 outside 1..{fmt.MAX_FILE_SIZE}"),
    (manifest_dict(shards=[5]), "manifest shard 0 must be an object"),
    (manifest_dict(shards=[shard_item(size=0)]), f"manifest shard 0 field 'size' = 0 outside 1..{fmt.MAX_FILE_SIZE}"),
    (manifest_dict(shards=[shard_item(checksum="x")]), "shard 0 checksum must be 16 lowercase hex digits, got 'x'"),
    (manifest_dict(shards=[shard_item(sample_count=0)]),
     f"manifest shard 0 field 'sample_count' = 0 outside 1..{fmt.MAX_SAMPLES}"),
    (manifest_dict(shards=[shard_item(size=100)]), "manifest shard 0 size 100 is not a multiple of the alignment 4096"),
    (manifest_dict(shards=[shard_item(4294967296)]),
     "manifest shard 0 (shards/shard-4294967296-00000000000000aa.pks) has number 4294967296, over the u32 limit "
     "4294967295"),
    (manifest_dict(sample_count=4, shards=[shard_item(1), shard_item(1)]),
     "manifest shard 1 (shards/shard-00001-00000000000000aa.pks) is not numbered after the shard before it (1); "
     "shards must be listed in increasing number order"),
    (manifest_dict(sample_count=3), "sample_count 3 differs from the sum of the shards' counts 2"),
    (manifest_dict(build=[]), "manifest 'build' must be an object and 'history' a list of objects"),
    (manifest_dict(history=[1]), "manifest 'build' must be an object and 'history' a list of objects"),
    (manifest_dict(history={}), "manifest 'build' must be an object and 'history' a list of objects"),
    (manifest_dict(created_by=5), "manifest 'created_by' must be a string"),
]


@pytest.mark.parametrize("obj, message", MANIFEST_CASES, ids=[f"case{i}" for i in range(len(MANIFEST_CASES))])
def test_manifest_errors_table(obj: Any, message: str) -> None:
    assert manifest_error(obj).message == message


def test_manifest_fields_that_default_and_limits() -> None:
    obj = manifest_dict()
    del obj["created_by"]
    parsed = fmt.parse_manifest(json.dumps(obj).encode())
    assert parsed.created_by == "" and parsed.build == {} and parsed.history == () and parsed.format_version == 1
    shard = shard_item(4294967295, size=4096, sample_count=2)  # the largest number and the smallest size
    assert fmt.parse_manifest(json.dumps(manifest_dict(shards=[shard])).encode()).shards[0].number == 4294967295
    assert fmt.parse_manifest(json.dumps(manifest_dict(shards=[shard_item(0)])).encode()).shards[0].number == 0
    tiny = manifest_dict(alignment=1, sample_count=1, shards=[shard_item(0, size=1, sample_count=1)])
    assert fmt.parse_manifest(json.dumps(tiny).encode()).shards[0].size == 1  # one byte is a valid shard size


def column_file(**header: int) -> bytearray:
    data = bytearray(b"".join(bytes(p) for p in fmt.encode_column_file(
        fmt.PLAN_MAGIC, 3, {"a": np.arange(3, dtype="<u8"), "b": np.arange(3, dtype="|u1")})))
    fields = dict(zip(("version", "header_size", "file_size", "rows", "count"),
                      struct.unpack_from("<IIQQI", data, 8)))
    fields.update(header)
    struct.pack_into("<IIQQI", data, 8, fields["version"], fields["header_size"], fields["file_size"], fields["rows"],
                     fields["count"])
    return data


def entry(data: bytearray, i: int, **changes: Any) -> bytearray:
    at = 64 + 64 * i
    name, dtype, offset, length = struct.unpack_from("<24s8sQQ", data, at)
    values = {"name": name, "dtype": dtype, "offset": offset, "length": length, **changes}
    struct.pack_into("<24s8sQQ", data, at, values["name"], values["dtype"], values["offset"], values["length"])
    return data


PLAN_PATH = "/data/ds/.packer-build/plan.pkp"


COLUMN_CASES = [
    (b"", NotAPackerFileError, "not a packer plan file (starts with b'')"),
    (b"PKPLAN\x00\x00" + bytes(10), TruncatedFileError, "plan file is 18 bytes, shorter than its 64-byte header"),
    (b"PKPLAN\x00", TruncatedFileError, "plan file is 7 bytes, shorter than its 64-byte header"),
    (b"PKINDEX\x00" + bytes(10), NotAPackerFileError, "not a packer plan file (starts with b'PKINDEX\\x00')"),
    (b"PKINDEX\x00" + bytes(100), NotAPackerFileError, "not a packer plan file (starts with b'PKINDEX\\x00')"),
    (column_file(version=9), UnsupportedVersionError,
     "plan format version 9 is not supported (this reader accepts [1]); upgrade packer"),
    (column_file(file_size=1000), TruncatedFileError, "plan file is 320 bytes on disk but its header says 1000 (truncated)"),
    (column_file(file_size=100), TruncatedFileError, "plan file is 320 bytes on disk but its header says 100 (extended)"),
    (column_file(count=0), CorruptHeaderError, f"column_count 0 outside 1..{fmt.MAX_COLUMNS}"),
    (column_file(count=65), CorruptHeaderError, f"column_count 65 outside 1..{fmt.MAX_COLUMNS}"),
    (column_file(header_size=128), CorruptHeaderError, "header_size 128 does not match 2 columns"),
    (column_file(rows=fmt.MAX_SAMPLES + 1), CorruptHeaderError,
     f"row_count {fmt.MAX_SAMPLES + 1} exceeds the limit {fmt.MAX_SAMPLES}"),
    (entry(column_file(), 1, name=b"\xffb"), CorruptHeaderError, "column 1 has a non-ASCII name b'\\xffb" + "\\x00" * 22 + "'"),
    (entry(column_file(), 1, name=b"a"), CorruptHeaderError, "column 1 has an invalid or repeated name 'a'"),
    (entry(column_file(), 1, name=b"B"), CorruptHeaderError, "column 1 has an invalid or repeated name 'B'"),
    (entry(column_file(), 1, name=b"bX"), CorruptHeaderError, "column 1 has an invalid or repeated name 'bX'"),
    (entry(column_file(), 1, dtype=b"<f8"), CorruptHeaderError, "column 'b' has unsupported dtype '<f8'"),
    (entry(column_file(), 1, dtype=b"|u1X"), CorruptHeaderError, "column 'b' has unsupported dtype '|u1X'"),
    (entry(column_file(), 1, offset=200), OverlappingRecordsError,
     "column 'b' starts at 200: must be a multiple of 64 at or after 216"),
    (entry(column_file(), 1, offset=192), OverlappingRecordsError,
     "column 'b' starts at 192: must be a multiple of 64 at or after 216"),
    (entry(column_file(), 0, length=17), OffsetOutOfBoundsError,
     "column 'a' (17 x 8 bytes at 192) runs past the end (320)"),
]


@pytest.mark.parametrize("data, error, message", COLUMN_CASES, ids=[f"case{i}" for i in range(len(COLUMN_CASES))])
def test_column_file_errors_are_exact(data: bytes, error: type, message: str) -> None:
    with pytest.raises(error) as caught:
        fmt.parse_column_file(bytes(data), fmt.PLAN_MAGIC, path=PLAN_PATH, kind="plan")
    assert type(caught.value) is error
    assert (caught.value.message, caught.value.path) == (message, PLAN_PATH)


def test_column_file_edges_are_accepted() -> None:
    data = bytes(entry(column_file(), 1, length=64))  # the largest length that fits: 64 bytes at 256 end at 320
    assert len(fmt.parse_column_file(data, fmt.PLAN_MAGIC)[1]["b"]) == 64
    with pytest.raises(OffsetOutOfBoundsError):
        fmt.parse_column_file(bytes(entry(column_file(), 1, length=65)), fmt.PLAN_MAGIC)
    assert fmt.parse_column_file(bytes(column_file(rows=fmt.MAX_SAMPLES)), fmt.PLAN_MAGIC)[0] == fmt.MAX_SAMPLES
    many = {f"c{i}": np.zeros(1, dtype="|u1") for i in range(fmt.MAX_COLUMNS)}
    assert len(fmt.parse_column_file(b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, 1, many)),
                                     fmt.INDEX_MAGIC)[1]) == fmt.MAX_COLUMNS
    # a header-only file (64 bytes, no room for the column table) is refused, not read past its end
    header_only = b"PKPLAN\x00\x00" + struct.pack("<IIQQI", 1, 192, 64, 0, 2) + bytes(28)
    with pytest.raises(CorruptHeaderError, match="^header_size 192 does not match 2 columns$"):
        fmt.parse_column_file(header_only, fmt.PLAN_MAGIC)
    exact = b"PKPLAN\x00\x00" + struct.pack("<IIQQI", 1, 64, 64, 0, 0) + bytes(28)
    with pytest.raises(CorruptHeaderError, match="column_count 0"):
        fmt.parse_column_file(exact, fmt.PLAN_MAGIC)  # exactly 64 bytes is a header, not "shorter than" one
    empty_column = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.PLAN_MAGIC, 0, {"a": np.zeros(0, dtype="<u8")}))
    assert len(empty_column) == 128 and len(fmt.parse_column_file(empty_column, fmt.PLAN_MAGIC)[1]["a"]) == 0
    # numpy arrays and memoryviews are accepted like bytes
    assert fmt.parse_column_file(np.frombuffer(bytes(column_file()), dtype=np.uint8), fmt.PLAN_MAGIC)[0] == 3


# --- JSON helpers: nesting depth and strict-JSON values -------------------------------------------


def reference_depth(data: bytes) -> int:
    """The least limit the build's own walker (``strictjson.json_depth_ok``, written separately
    for source rows) accepts: the deepest nesting, strings skipped, never below zero."""
    from packer.sources.strictjson import json_depth_ok
    text = data.decode("latin-1")
    return next(limit for limit in range(len(text) + 1) if json_depth_ok(text, limit))


DEPTH_CASES = [b"", b"1", b'"x"', b"[]", b"{}", b"[[1],[2,[3]]]", b'{"a": {"b": [1, {"c": 2}]}}',
               b"]]", b"}}}", b"]{", b"} [ [", b'["[[[", "{{"]', b'"\\"[["', b"[|]", b"[~]", b"[^]", b"{|}",
               b"[" * 70 + b"]" * 70, b'{"k": "v|~^"}', b"| ~ ^ ]", b'"unterminated [[['  ]


@pytest.mark.parametrize("data", DEPTH_CASES, ids=[f"depth{i}" for i in range(len(DEPTH_CASES))])
def test_json_nesting_depth_matches_a_byte_walk(data: bytes) -> None:
    assert fmt.json_nesting_depth(data) == reference_depth(data)
    assert type(fmt.json_nesting_depth(data)) is int


def nested(levels: int, kind: str) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"k": value} if kind == "dict" else [value]
    return value


@pytest.mark.parametrize("kind", ["dict", "list"])
def test_json_ready_keeps_exactly_max_depth_levels(kind: str) -> None:
    for levels in range(0, 5):
        for max_depth in range(0, 5):
            got = fmt.json_ready(nested(levels, kind), max_depth=max_depth)
            # the levels that fit are kept; the first container past max_depth becomes None
            want = nested(levels, kind) if levels <= max_depth else _cut(nested(levels, kind), max_depth)
            assert got == want, (levels, max_depth)
    deep = nested(fmt.MAX_JSON_DEPTH, kind)
    assert fmt.json_ready(deep) == deep
    assert fmt.json_ready(nested(fmt.MAX_JSON_DEPTH + 1, kind)) == _cut(nested(fmt.MAX_JSON_DEPTH + 1, kind),
                                                                       fmt.MAX_JSON_DEPTH)


def _cut(value: Any, depth: int) -> Any:
    if isinstance(value, (dict, list)):
        if depth == 0:
            return None
        if isinstance(value, dict):
            return {k: _cut(v, depth - 1) for k, v in value.items()}
        return [_cut(v, depth - 1) for v in value]
    return value


def test_json_ready_mixed_containers_and_values() -> None:
    value = {"a": [1.5, float("nan"), (2, {"b": float("inf")})], 3: "x"}
    assert fmt.json_ready(value) == {"a": [1.5, None, [2, {"b": None}]], "3": "x"}
    assert fmt.json_ready(value, max_depth=2) == {"a": [1.5, None, None], "3": "x"}
    assert fmt.json_ready([{"a": [1]}], max_depth=2) == [{"a": None}]


# --- checksums and names --------------------------------------------------------------------------


def test_class_list_checksum_of_names_that_are_not_utf8() -> None:
    import xxhash
    raw = b"caf\xe9"  # Latin-1 folder name, held as a surrogate-escaped str
    name = raw.decode("utf-8", "surrogateescape")
    want = xxhash.xxh3_64(raw + b"\n" + b"dog\n").intdigest()
    assert fmt.class_list_checksum([name, "dog"]) == f"{want:016x}"
    assert fmt.class_list_checksum([]) == f"{xxhash.xxh3_64(b'').intdigest():016x}"


def _manifest(**changes: Any) -> fmt.Manifest:
    """The spec's base vector manifest, with ``changes`` applied."""
    import dataclasses
    from pathlib import Path
    data = (Path(__file__).resolve().parents[2] / "formats/vectors/valid/base-align512/manifest.json").read_bytes()
    return dataclasses.replace(fmt.parse_manifest(data), **changes)


def test_dump_manifest_makes_unknown_members_strict_json_and_keeps_utf8() -> None:
    raw = dict(_manifest().raw, x_future={"ratio": float("nan"), "deep": nested(70, "list")})
    manifest = _manifest(classes=("café",), raw=raw)
    text = fmt.dump_manifest(manifest)
    assert "café".encode("utf-8") in text  # written as UTF-8, not as \u escapes
    loaded = json.loads(text)
    assert loaded["x_future"]["ratio"] is None
    assert fmt.json_nesting_depth(json.dumps(loaded["x_future"]["deep"]).encode()) == fmt.MAX_JSON_DEPTH - 1


# --- the manifest: the shard-count pre-scan (R36, R18) and field declarations with their path -----


VECTORS = Path(__file__).resolve().parents[2] / "formats" / "vectors" / "valid"




def manifest_doc(vector: str = "base-align512") -> dict[str, Any]:
    return json.loads((VECTORS / vector / "manifest.json").read_bytes())


def refusal(document: dict[str, Any]) -> ManifestError:
    with pytest.raises((ManifestError, UnsafePathError)) as caught:
        fmt.parse_manifest(json.dumps(document).encode(), path=MANIFEST_PATH)
    assert caught.value.path == MANIFEST_PATH
    return caught.value


def test_more_shards_than_samples_is_refused_first() -> None:
    doc = manifest_doc()
    doc["sample_count"] = 1
    error = refusal(doc)
    assert error.message == "manifest lists 2 shards for 1 samples; every shard holds at least one sample"


@pytest.mark.parametrize("counts, total", [([1, 1], 3), ([2, 2], 3), ([1, 3], 5)], ids=["ones", "twos", "mixed"])
def test_counts_that_cannot_add_up_are_refused_before_a_bad_entry(counts: list[int], total: int) -> None:
    """The pre-scan sums the raw counts: a bad path in an entry is not reached (R18 before R19)."""
    doc = manifest_doc()
    for entry, count in zip(doc["shards"], counts):
        entry["sample_count"] = count
    doc["sample_count"] = total
    doc["shards"][1]["path"] = "../outside.pks"
    error = refusal(doc)
    assert error.message == f"sample_count {total} differs from the sum of the shards' counts {sum(counts)}"


def test_a_count_at_the_limit_is_summed_by_the_pre_scan() -> None:
    doc = manifest_doc()
    doc["shards"][0]["sample_count"] = fmt.MAX_SAMPLES
    doc["shards"][1]["sample_count"] = 1
    doc["sample_count"] = fmt.MAX_SAMPLES
    doc["shards"][1]["path"] = "../outside.pks"
    assert refusal(doc).message == (
        f"sample_count {fmt.MAX_SAMPLES} differs from the sum of the shards' counts {fmt.MAX_SAMPLES + 1}")


def test_an_entry_the_pre_scan_cannot_read_is_named_by_its_own_check() -> None:
    doc = manifest_doc()
    doc["shards"][0]["sample_count"] = "2"  # not an integer: R35 names the entry
    doc["sample_count"] = 99
    error = refusal(doc)
    assert error.message.startswith("manifest shard 0 field 'sample_count' must be")


def one_shard_manifest(*, alignment: int, size: int, count: int, number: int) -> dict[str, Any]:
    doc = manifest_doc()
    doc["alignment"] = alignment
    doc["sample_count"] = count
    doc["shards"] = [{"path": f"shards/shard-{number:05d}-00000000000000aa.pks", "size": size,
                      "sample_count": count, "checksum": "00000000000000aa"}]
    return doc


@pytest.mark.parametrize("alignment, size, count, number", [
    (1, 1, 1, 0), (1, fmt.MAX_FILE_SIZE, fmt.MAX_SAMPLES, fmt.MAX_SHARD_NUMBER), (4096, 4096, 7, 12345)],
    ids=["smallest", "largest", "typical"])
def test_valid_shard_entries_take_the_fast_path(monkeypatch: pytest.MonkeyPatch, alignment: int, size: int,
                                                 count: int, number: int) -> None:
    """Every valid entry, limits included, is built by the inlined checks, not by the slow path
    (which exists to name what is wrong with an entry; a million-entry manifest would pay for it)."""
    doc = one_shard_manifest(alignment=alignment, size=size, count=count, number=number)
    want = fmt.parse_manifest(json.dumps(doc).encode()).shards
    def slow_path(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a valid entry took the slow path")
    monkeypatch.setattr(fmt, "_shard_entry", slow_path)
    got = fmt.parse_manifest(json.dumps(doc).encode()).shards
    assert got == want and [(s.size, s.sample_count, s.checksum) for s in got] == [(size, count, 0xAA)]
    two = manifest_doc()  # and a list of several entries (the base vector's two shards)
    assert len(fmt.parse_manifest(json.dumps(two).encode()).shards) == 2


@pytest.mark.parametrize("member, value, message", [
    ("size", "512", "manifest shard 0 field 'size' must be an integer, got a string"),
    ("sample_count", "2", "manifest shard 0 field 'sample_count' must be an integer, got a string"),
    ("checksum", 5, "shard 0 checksum must be 16 lowercase hex digits, got 5"),
    ("path", 5, "manifest shard 0 field 'path' must be a string, got an integer"),
    ("size", 513, "manifest shard 0 size 513 is not a multiple of the alignment 512"),
    ("size", 1025, "manifest shard 0 size 1025 is not a multiple of the alignment 512"),
], ids=["size-str", "count-str", "checksum-int", "path-int", "size-513", "size-1025"])
def test_mistyped_shard_entries_are_named_not_crashed_on(member: str, value: Any, message: str) -> None:
    doc = manifest_doc()
    doc["shards"][0][member] = value
    error = refusal(doc)
    assert type(error) is ManifestError and error.message == message


def test_repeated_top_shard_number_is_an_ordering_error() -> None:
    doc = manifest_doc()
    top = fmt.MAX_SHARD_NUMBER
    for entry in doc["shards"]:
        entry["path"] = f"shards/shard-{top}-{entry['checksum']}.pks"
    error = refusal(doc)
    assert error.message == (f"manifest shard 1 (shards/shard-{top}-{doc['shards'][1]['checksum']}.pks) is not "
                             f"numbered after the shard before it ({top}); shards must be listed in increasing "
                             f"number order")


@pytest.mark.parametrize("limits, message", [
    ([], "manifest field 'limits' must be an object, got an array"),
    ({"max_pixels": 0}, f"manifest limits field 'max_pixels' = 0 outside 1..{fmt.MAX_FILE_SIZE}"),
    ({"max_pixels": "9"}, "manifest limits field 'max_pixels' must be an integer, got a string"),
], ids=["array", "zero", "string"])
def test_limits_refusals(limits: Any, message: str) -> None:
    doc = manifest_doc()
    doc["limits"] = limits
    assert refusal(doc).message.startswith(message)


def test_limits_max_pixels_of_one_is_accepted() -> None:
    doc = manifest_doc()
    doc["limits"] = {"max_pixels": 1}
    assert fmt.parse_manifest(json.dumps(doc).encode()).max_pixels == 1


def test_shard_count_cap_is_inclusive_and_names_the_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    """[R36] at most MAX_SHARDS entries (the real cap, 2^24, needs a manifest of ~50 MB of `0,`)."""
    monkeypatch.setattr(fmt, "MAX_SHARDS", 2)
    assert len(fmt.parse_manifest(json.dumps(manifest_doc()).encode()).shards) == 2  # exactly at the cap
    doc = manifest_doc()
    doc["shards"] = [None] * 3
    assert refusal(doc).message == "manifest lists 3 shards, over the 2 limit"
