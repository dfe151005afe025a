"""Mutation kill tests for packer/format.py: field declarations, columns, field shards, the manifest.

Written after the declared fields (SPEC §14) landed: each pins down behaviour that a surviving
mutant of `scripts/mutate.py` changed. `tests/project/test_mutation_kills.py` holds the ones from before.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from packer import format as fmt
from packer.errors import CorruptHeaderError, IndexMismatchError, OffsetOutOfBoundsError, OverlappingRecordsError
from packer.fields import FieldSpec


# --- JSON helpers: nesting depth and strict-JSON values ---------------------------------------

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


# --- checksums and names ------------------------------------------------------------------------

def test_class_list_checksum_of_names_that_are_not_utf8() -> None:
    import xxhash
    raw = b"caf\xe9"  # Latin-1 folder name, held as a surrogate-escaped str
    name = raw.decode("utf-8", "surrogateescape")
    want = xxhash.xxh3_64(raw + b"\n" + b"dog\n").intdigest()
    assert fmt.class_list_checksum([name, "dog"]) == f"{want:016x}"
    assert fmt.class_list_checksum([]) == f"{xxhash.xxh3_64(b'').intdigest():016x}"


def test_field_shard_file_name_bounds() -> None:
    assert fmt.field_shard_file_name("mask", 0, 0xAB) == "shards/field-mask-00000-00000000000000ab.pks"
    top = fmt.MAX_SHARD_NUMBER
    assert fmt.field_shard_file_name("mask", top, 1) == f"shards/field-mask-{top}-0000000000000001.pks"
    for bad in (-1, top + 1):
        with pytest.raises(ValueError) as caught:
            fmt.field_shard_file_name("mask", bad, 1)
        assert str(caught.value) == f"shard number {bad} outside 0..{top}"


def test_unsafe_field_shard_path_names_the_expected_form() -> None:
    from packer.errors import UnsafePathError
    with pytest.raises(UnsafePathError) as caught:
        fmt.check_relative_path("shards/field-mask-1-00.pks", fmt._FIELD_SHARD_PATH, what="field shard")
    assert caught.value.message == (
        "field shard 'shards/field-mask-1-00.pks' is not a valid dataset path (expected "
        "shards/field-<field name>-<number, at least 5 digits>-<16 hex digits>.pks, relative, inside the dataset)")


def test_manifest_field_lookup_raises_keyerror_with_the_name() -> None:
    spec = FieldSpec("tags", "classes", dtype="int64", num_classes=3)
    manifest = _manifest(fields=(spec,))
    assert manifest.field("tags") is spec
    with pytest.raises(KeyError) as caught:
        manifest.field("boxes")
    assert caught.value.args == ("boxes",)


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


# --- declared fields in the index: columns (R46), offsets (R47), class numbers (R49), images (R48)

FIELD_INDEX = "/data/ds/index-00000000000000dd.pki"


def field_columns(spec: FieldSpec, values: list[Any]) -> dict[str, np.ndarray]:
    """The index columns of ``spec`` holding ``values`` (one per sample), as the writer lays them out."""
    if spec.variable:
        dtype = "|u1" if spec.kind == "text" else spec.numpy_dtype
        parts = [np.frombuffer(v.encode(), "|u1") if spec.kind == "text"
                 else np.asarray(v, dtype=dtype).reshape(-1).view("|u1") for v in values]
        offsets = np.zeros(len(values) + 1, dtype="<u8")
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        blob = np.concatenate(parts) if parts else np.zeros(0, "|u1")
        return {spec.column: blob.astype("|u1"), spec.offsets_column: offsets}
    blob = np.asarray(values, dtype=spec.numpy_dtype).reshape(-1).view("|u1")
    return {spec.column: blob.copy()}


def validate_fields(spec: FieldSpec, columns: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    counts = np.array([rows], dtype=np.int64)
    return fmt._validate_field(spec, rows, columns, counts, 4096, path=FIELD_INDEX)


LABELS = FieldSpec("labels", "array", dtype="int16", shape=(2,), classes=("a", "b", "c"), num_classes=3)
BOX_LABELS = FieldSpec("boxlab", "array", dtype="uint64", shape=(-1,), classes=("cat", "dog"), num_classes=2)
TAGS = FieldSpec("tags", "classes", dtype="int64", num_classes=3)

CLASS_NUMBER_CASES = [
    # fixed records of two int16: the bad value's sample is byte // record_bytes
    (LABELS, [[0, 1], [2, 0], [1, 3]], "field 'labels' holds value 3, not a class number 0..2", 2),
    (LABELS, [[0, 2], [-1, 0], [1, 2]], "field 'labels' holds value -1, not a class number 0..2", 1),
    (LABELS, [[0, 1], [2, 0], [7, -4]], "field 'labels' holds value 7, not a class number 0..2", 2),
    (LABELS, [[0, 1], [2, 2], [0, -300]], "field 'labels' holds value -300, not a class number 0..2", 2),
    # variable arrays (boxes' labels): the sample is found from the offsets (empty samples between)
    (BOX_LABELS, [[0, 1], [], [1, 0, 2]], "field 'boxlab' holds value 2, not a class number 0..1", 2),
    (BOX_LABELS, [[0], [], [], [1 << 63]], f"field 'boxlab' holds value {1 << 63}, not a class number 0..1", 3),
    (BOX_LABELS, [[5], [0]], "field 'boxlab' holds value 5, not a class number 0..1", 0),
    # class-id sets: ids are int64, the offsets count bytes
    (TAGS, [[0], [], [1, 3]], "field 'tags' holds class id 3 outside 0..2", 2),
    (TAGS, [[0, 1, 2, 0, 1, 2, 0, 1], [9]], "field 'tags' holds class id 9 outside 0..2", 1),
    (TAGS, [[0, 1], [-2], [1]], "field 'tags' holds class id -2 outside 0..2", 1),
    (TAGS, [[3], [1]], "field 'tags' holds class id 3 outside 0..2", 0),
]


@pytest.mark.parametrize("spec, values, message, sample", CLASS_NUMBER_CASES,
                         ids=[f"case{i}" for i in range(len(CLASS_NUMBER_CASES))])
def test_field_class_numbers_out_of_range_name_the_sample(spec: FieldSpec, values: list[Any], message: str,
                                                          sample: int) -> None:
    with pytest.raises(IndexMismatchError) as caught:
        validate_fields(spec, field_columns(spec, values), len(values))
    assert type(caught.value) is IndexMismatchError
    assert (caught.value.message, caught.value.path, caught.value.sample) == (message, FIELD_INDEX, sample)


@pytest.mark.parametrize("spec, values", [
    (LABELS, [[0, 1], [2, 0], [1, 2]]), (BOX_LABELS, [[0, 1], [], [1]]), (TAGS, [[0, 2], [], [1]]),
    (BOX_LABELS, [[], []]), (TAGS, [[], [], []])], ids=["fixed", "variable", "sets", "no-boxes", "no-tags"])
def test_field_class_numbers_in_range_pass(spec: FieldSpec, values: list[Any]) -> None:
    columns = field_columns(spec, values)
    found = validate_fields(spec, columns, len(values))
    assert set(found) == set(spec.columns()) and all(found[name] is columns[name] for name in found)


BOXES = FieldSpec("boxes", "array", dtype="float32", shape=(-1, 4))
CAPTION = FieldSpec("caption", "text")


def test_field_offsets_are_checked_with_the_field_names_and_records() -> None:
    columns = field_columns(BOXES, [[[1, 2, 3, 4]], [], [[5, 6, 7, 8], [9, 9, 9, 9]]])
    assert validate_fields(BOXES, columns, 3)[BOXES.column] is columns[BOXES.column]
    decreasing = dict(columns, **{BOXES.offsets_column: np.array([0, 32, 16, 48], dtype="<u8")})
    with pytest.raises(OverlappingRecordsError) as caught:
        validate_fields(BOXES, decreasing, 3)
    assert (caught.value.message, caught.value.path) == (
        "index column 'f_boxes__offsets' must start at 0, never decrease and end at the 'f_boxes' length 48",
        FIELD_INDEX)
    half_box = dict(columns, **{BOXES.offsets_column: np.array([0, 8, 16, 48], dtype="<u8")})
    with pytest.raises(OverlappingRecordsError) as caught:
        validate_fields(BOXES, half_box, 3)
    assert (caught.value.message, caught.value.path, caught.value.sample) == (
        "index column 'f_boxes__offsets' entry 1 = 8 is not a multiple of the field's 16-byte record",
        FIELD_INDEX, 0)
    for offsets, sample in (([0, 16, 24, 48], 1), ([0, 16, 32, 40, 48], 2), ([0, 16, 32, 48, 48], None)):
        rows = len(offsets) - 1
        blob = np.zeros(48, dtype="|u1")
        damaged = {BOXES.column: blob, BOXES.offsets_column: np.array(offsets, dtype="<u8")}
        if sample is None:
            assert validate_fields(BOXES, damaged, rows)[BOXES.offsets_column].tolist() == offsets
            continue
        with pytest.raises(OverlappingRecordsError) as caught:
            validate_fields(BOXES, damaged, rows)
        assert caught.value.sample == sample
        assert caught.value.message.startswith(f"index column 'f_boxes__offsets' entry {sample + 1} = ")
    ids = FieldSpec("ids", "array", dtype="int16", shape=(-1,))
    odd = {ids.column: np.zeros(4, dtype="|u1"), ids.offsets_column: np.array([0, 3, 4], dtype="<u8")}
    with pytest.raises(OverlappingRecordsError) as caught:
        validate_fields(ids, odd, 2)
    assert (caught.value.message, caught.value.sample) == (
        "index column 'f_ids__offsets' entry 1 = 3 is not a multiple of the field's 2-byte record", 0)
    # a text field's offsets step in bytes: any split of the blob is valid
    text = field_columns(CAPTION, ["a", "bcd", ""])
    text[CAPTION.offsets_column] = np.array([0, 3, 3, 4], dtype="<u8")
    assert validate_fields(CAPTION, text, 3)[CAPTION.column].tobytes() == b"abcd"
    tags = field_columns(TAGS, [[0], [1, 2]])
    tags[TAGS.offsets_column] = np.array([0, 4, 24], dtype="<u8")
    with pytest.raises(OverlappingRecordsError) as caught:
        validate_fields(TAGS, tags, 2)
    assert caught.value.message == "index column 'f_tags__offsets' entry 1 = 4 is not a multiple of the field's 8-byte record"


def test_missing_field_column_names_the_index() -> None:
    columns = field_columns(LABELS, [[0, 1]])
    with pytest.raises(CorruptHeaderError) as caught:
        validate_fields(LABELS, {}, 1)
    assert (caught.value.message, caught.value.path) == (
        "index (field 'labels') lacks required column 'f_labels'", FIELD_INDEX)
    with pytest.raises(IndexMismatchError) as caught:
        validate_fields(LABELS, columns, 2)
    assert (caught.value.message, caught.value.path) == (
        "index (field 'labels') column 'f_labels' has 4 entries, expected 8", FIELD_INDEX)


def test_image_field_payloads_are_checked_against_its_own_shards() -> None:
    shard = fmt.ShardEntry("shards/field-mask-00000-00000000000000ee.pks", 8192, 0xEE, 2)
    spec = FieldSpec("mask", "image", shards=(shard,))
    columns = {spec.image_column(part): np.array(values, dtype=typestr) for part, typestr, values in (
        ("offset", "<u8", [4096, 8192]), ("size", "<u8", [10, 20]), ("checksum", "<u8", [1, 2]),
        ("format", "|u1", [1, 1]), ("width", "<u4", [2, 2]), ("height", "<u4", [2, 2]), ("channels", "|u1", [1, 1]))}
    counts = np.array([2], dtype=np.int64)
    with pytest.raises(OffsetOutOfBoundsError) as caught:
        fmt._validate_field(spec, 2, columns, counts, 4096, path=FIELD_INDEX)
    assert (caught.value.message, caught.value.path, caught.value.sample) == (
        "field 'mask': shard 0 (shards/field-mask-00000-00000000000000ee.pks) is 8192 bytes but its samples "
        "end at 12288", FIELD_INDEX, 1)
    fine = dataclasses_replace(spec, shards=(fmt.ShardEntry(shard.path, 12288, 0xEE, 2),))
    assert fmt._validate_field(fine, 2, columns, counts, 4096, path=FIELD_INDEX).keys() == columns.keys()


def dataclasses_replace(spec: FieldSpec, **changes: Any) -> FieldSpec:
    import dataclasses
    return dataclasses.replace(spec, **changes)


# --- the manifest: the shard-count pre-scan (R36, R18) and field declarations with their path --

from pathlib import Path  # noqa: E402

from packer.errors import ManifestError, UnsafePathError  # noqa: E402

VECTORS = Path(__file__).resolve().parents[2] / "formats" / "vectors" / "valid"
MANIFEST_PATH = "/data/ds/manifest.json"


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


FIELD_REFUSALS = [
    (lambda f: f[0].update(shards=[]), "manifest field 0 (boxes) is not an image field and lists shards"),
    (lambda f: f[4].update(shards=f[4]["shards"][:1]),
     "manifest field 4 (mask) must list one shard per main shard (2), got 1"),
    (lambda f: f[4].update(shards={"a": 1}), "manifest field 4 (mask) must list one shard per main shard (2), got dict"),
    (lambda f: f[4].update(shards=None), "manifest field 4 (mask) must list one shard per main shard (2), got NoneType"),
    (lambda f: f[4]["shards"][1].update(size=321),
     "manifest field 4 (mask) shard 1 size 321 is not a multiple of the alignment 64"),
    (lambda f: f[4]["shards"][1].update(sample_count=3),
     "manifest field 4 (mask) shard 1 (shards/field-mask-00001-6300daef48d33298.pks) must be the 'mask' shard "
     "numbered 1 with 2 samples, like main shard 1"),
    (lambda f: f[4]["shards"][0].update(path="shards/field-mask-00001-cb4fa04c5f00816f.pks"),
     "manifest field 4 (mask) shard 0 (shards/field-mask-00001-cb4fa04c5f00816f.pks) must be the 'mask' shard "
     "numbered 0 with 2 samples, like main shard 0"),
    (lambda f: f[4]["shards"][0].update(path="shards/field-boxes-00000-cb4fa04c5f00816f.pks"),
     "manifest field 4 (mask) shard 0 (shards/field-boxes-00000-cb4fa04c5f00816f.pks) must be the 'mask' shard "
     "numbered 0 with 2 samples, like main shard 0"),
    (lambda f: f[4]["shards"].__setitem__(0, 7), "manifest field 4 (mask) shard 0 must be an object"),
]


@pytest.mark.parametrize("change, message", FIELD_REFUSALS, ids=[f"case{i}" for i in range(len(FIELD_REFUSALS))])
def test_field_declaration_refusals_name_the_field_and_the_manifest(change: Any, message: str) -> None:
    doc = manifest_doc("fields")
    change(doc["fields"])
    error = refusal(doc)
    assert type(error) is ManifestError and error.message == message


def test_bad_field_declarations_and_field_shard_paths_carry_the_manifest_path() -> None:
    doc = manifest_doc("fields")
    doc["fields"][1]["dtype"] = "complex"
    assert "dtype 'complex' is not one of" in refusal(doc).message
    doc = manifest_doc("fields")
    doc["fields"][4]["shards"][0]["path"] = "shards/field-mask-0-cb4fa04c5f00816f.pks"
    error = refusal(doc)
    assert type(error) is UnsafePathError
    assert error.message.startswith("manifest field 4 (mask) shard 0 path 'shards/field-mask-0-cb4fa04c5f00816f.pks'")
    parsed = fmt.parse_manifest(json.dumps(manifest_doc("fields")).encode())
    assert [s.path for s in parsed.field("mask").shards] == [
        "shards/field-mask-00000-cb4fa04c5f00816f.pks", "shards/field-mask-00001-6300daef48d33298.pks"]


def test_validate_index_checks_each_field_with_the_index_path() -> None:
    shards = [fmt.ShardEntry("shards/shard-00000-00000000000000aa.pks", 16384, 1, 2),
              fmt.ShardEntry("shards/shard-00001-00000000000000bb.pks", 8192, 2, 1)]
    values = {"shard": [0, 0, 1], "offset": [4096, 8192, 4096], "size": [100, 5000, 10], "checksum": [1, 2, 3],
              "label": [0, 1, 0], "width": [1, 2, 3], "height": [1, 2, 3], "channels": [3, 3, 1],
              "image_format": [1, 2, 1], "key_offsets": [0, 1, 2, 3], "keys": list(b"abc"),
              "meta_offsets": [0, 0, 0, 0], "meta": []}
    columns = {name: np.array(values[name], dtype=typestr) for name, (typestr, _) in fmt.INDEX_COLUMNS.items()}
    columns.update(field_columns(TAGS, [[0], [1, 2], [2]]))
    ix = fmt.validate_index(3, columns, shards, 4096, path=FIELD_INDEX, fields=(TAGS,))
    assert ix.field_columns[TAGS.offsets_column].tolist() == [0, 8, 24, 32]
    columns.update(field_columns(TAGS, [[0], [1, 2], [5]]))
    with pytest.raises(IndexMismatchError) as caught:
        fmt.validate_index(3, columns, shards, 4096, path=FIELD_INDEX, fields=(TAGS,))
    assert (caught.value.message, caught.value.path, caught.value.sample) == (
        "field 'tags' holds class id 5 outside 0..2", FIELD_INDEX, 2)


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
