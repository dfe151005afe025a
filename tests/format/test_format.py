"""Unit tests of packer/format.py: headers, column files, names, manifest, and offsets past 4 GiB."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

import packer
from packer import format as fmt
from packer.errors import (CorruptHeaderError, ManifestError, NotAPackerFileError, OffsetOutOfBoundsError,
                           OverlappingRecordsError, TruncatedFileError, UnsafePathError,
                           UnsupportedVersionError)

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "formats" / "vectors" / "valid" / "base-align512"


# --- spec and code agree ------------------------------------------------------------------------

def test_spec_requirements_match_code_tags() -> None:
    """Every reader requirement of SPEC.md is tagged [Rn] in the code, and every tag is specified."""
    spec = (REPO / "formats" / "SPEC.md").read_text("utf-8")
    specified = re.findall(r"^\| (R\d+) \|", spec, flags=re.M)
    assert len(specified) == len(set(specified)), "a requirement id appears twice in the tables"
    code = "".join((REPO / "packer" / name).read_text("utf-8") for name in ("format.py", "dataset.py", "files.py"))
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
