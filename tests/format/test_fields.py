"""Declared fields (formats/SPEC.md §14): declarations, value encoding, build, read, and the open checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.dataset import open_dataset, open_index
from packer.errors import (
                           CorruptHeaderError,
                           IndexMismatchError,
                           ManifestError,
                           OffsetOutOfBoundsError,
                           OptionError,
                           SampleIndexTypeError,
                           OverlappingRecordsError,
                           UnsafePathError,
)
from packer.fields import (
                           ClassVocabulary,
                           FieldSpec,
                           FieldValueError,
                           decode_value,
                           encode_value,
                           multi_hot,
                           parse_field_option,
                           parse_fields_schema,
)
from packer.writer import BuildOptions, build

from helpers import FIELDS, make_field_source
from test_format import _manifest, manifest_doc, refusal


# --- declarations -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, kind, dtype, shape, variable", [
    ("boxes=float32[N,4]", "array", "float32", (-1, 4), True),
    ("boxes=json:float32[N,4]", "array", "float32", (-1, 4), True),
    ("score=float32", "array", "float32", (), False),
    ("target=x", None, None, None, None),
    ("xy=float64[2]", "array", "float64", (2,), False),
    ("kp=float32[N,17,3]", "array", "float32", (-1, 17, 3), True),
    ("tags=classes", "classes", "int64", (), True),
    ("caption=text@txt", "text", "", (), True),
    ("mask=image@mask.png", "image", "", (), False),
])
def test_field_option_forms(text: str, kind: str | None, dtype: str | None, shape: tuple | None,
                            variable: bool | None) -> None:
    if kind is None:
        with pytest.raises(OptionError, match="reserved"):
            parse_field_option(text)
        return
    spec = parse_field_option(text)
    assert (spec.kind, spec.dtype, spec.shape, spec.variable) == (kind, dtype, shape, variable)


def test_field_option_source_and_class_count() -> None:
    assert parse_field_option("caption=text@txt").source == "txt"
    assert parse_field_option("caption=text").source == "caption"
    assert parse_field_option("tags=classes(80)").num_classes == 80


@pytest.mark.parametrize("text, message", [
    ("boxes", "expected NAME=TYPE"),
    ("Boxes=float32", "name 'Boxes'"),
    ("a__b=float32", "without '__'"),
    ("averyverylongname=float32", "1-12 characters"),
    ("boxes=float33", "unknown type 'float33'"),
    ("boxes=float32[4,N]", "dimension 'N'"),
    ("boxes=float32[0]", "positive integers"),
    ("tags=classes(0)", "positive number of classes"),
    ("big=uint8[2048,1024]", "over the 1048576 limit"),
])
def test_field_option_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(OptionError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_field_option(text)


def test_schema_file_forms_and_repeats() -> None:
    specs = parse_fields_schema(["boxes=float32[N,4]", {"name": "tags", "kind": "classes", "classes": ["a", "b"]}])
    assert [s.name for s in specs] == ["boxes", "tags"] and specs[1].num_classes == 2
    with pytest.raises(OptionError, match="unique"):
        parse_fields_schema(["a=float32", "a=text"])
    with pytest.raises(OptionError, match="index columns"):
        parse_fields_schema([f"m{i}=image" for i in range(8)])


# --- values ---------------------------------------------------------------------------------------

def _spec(text: str) -> FieldSpec:
    return parse_field_option(text)


def test_array_values_round_trip_with_shape_and_dtype() -> None:
    spec = _spec("boxes=float32[N,4]")
    data = encode_value(spec, [[1, 2, 3, 4.5], [5, 6, 7, 8]])
    value = decode_value(spec, np.frombuffer(data, np.uint8))
    assert value.dtype == np.float32 and value.shape == (2, 4) and value[0, 3] == 4.5
    empty = decode_value(spec, np.frombuffer(encode_value(spec, []), np.uint8))
    assert empty.shape == (0, 4)
    scalar = _spec("score=float64")
    assert decode_value(scalar, np.frombuffer(encode_value(scalar, 0.25), np.uint8)) == 0.25


@pytest.mark.parametrize("text, value, message", [
    ("boxes=float32[N,4]", [[1, 2, 3]], "got shape [1, 3]"),
    ("boxes=float32[N,4]", [[1, 2, 3, 4], [1, 2]], "ragged"),
    ("boxes=float32[N,4]", "1,2,3,4", "got a string"),
    ("boxes=float32[N,4]", [[1, 2, "x", 4]], "holds a string"),
    ("score=float32", [1.0], "got shape [1]"),
    ("score=float32", None, "got null"),
    ("count=uint8", 300, "outside the uint8 range"),
    ("count=int32", 1.5, "holds a number"),
    ("count=int32", True, "holds a boolean"),
    ("boxes=float32[N,4]", [[True, 2, 3, 4]], "holds a boolean"),   # numpy would read true as 1
    ("count=int32[3]", [1, False, 2], "holds a boolean"),
    ("score=float32[2]", [True, 2.5], "holds a boolean"),
    ("score=float16", 1e10, "overflows float16"),
    ("caption=text", 5, "is text, got an integer"),
])
def test_value_errors_are_typed_and_say_what_was_expected(text: str, value: object, message: str) -> None:
    with pytest.raises(FieldValueError, match=message.replace("[", r"\[")):
        encode_value(_spec(text), value)


def test_csv_cells_are_json_and_tag_lists() -> None:
    boxes = _spec("boxes=float32[N,4]")
    assert decode_value(boxes, np.frombuffer(encode_value(boxes, "[[0,0,1,1]]", from_text=True), np.uint8)).shape == (1, 4)
    tags = _spec("tags=classes")
    vocabulary = ClassVocabulary(tags)
    stored = encode_value(tags, "dog|cat", vocabulary=vocabulary, from_text=True)
    assert np.frombuffer(stored, "<i8").tolist() == [0, 1]  # ids by first appearance, renumbered at finish


def test_class_sets_are_sorted_unique_and_renumbered_by_name() -> None:
    tags = _spec("tags=classes")
    vocabulary = ClassVocabulary(tags)
    rows = [["zebra", "ant"], ["ant", "ant"], []]
    blobs = [encode_value(tags, row, vocabulary=vocabulary) for row in rows]
    offsets = np.cumsum([0] + [len(b) for b in blobs]).astype(np.uint64)
    final, blob = vocabulary.finish(np.frombuffer(b"".join(blobs), np.uint8), offsets)
    assert final.classes == ("ant", "zebra") and final.num_classes == 2
    ids = np.frombuffer(blob.tobytes(), "<i8")
    assert ids[0:2].tolist() == [0, 1] and ids[2:3].tolist() == [0]
    assert multi_hot(ids[0:2], 2).tolist() == [1.0, 1.0]


def test_class_ids_and_names_do_not_mix() -> None:
    tags = _spec("tags=classes(3)")
    vocabulary = ClassVocabulary(tags)
    assert np.frombuffer(encode_value(tags, [2, 0], vocabulary=vocabulary), "<i8").tolist() == [0, 2]
    with pytest.raises(FieldValueError, match="outside 0..2"):
        encode_value(tags, [3], vocabulary=vocabulary)
    with pytest.raises(FieldValueError, match="mixes"):
        encode_value(tags, ["cat"], vocabulary=vocabulary)






@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fields")
    manifest = make_field_source(root / "src")
    out = root / "out"
    build(manifest, out, BuildOptions(fields=FIELDS, shard_size=3 * 8192, seed=3, alignment=4096))
    return manifest, out


def test_every_field_kind_reads_back_as_written(built: tuple[Path, Path]) -> None:
    manifest, out = built
    rows = {json.loads(line)["path"]: json.loads(line) for line in manifest.read_text("utf-8").splitlines()}
    with open_dataset(out, verify_checksums=True) as ds:
        assert [spec.name for spec in ds.fields] == ["boxes", "tags", "caption", "depth", "mask"]
        assert len(ds.manifest.shards) > 1  # the image field runs parallel to several shards
        tags = ds.field_spec("tags")
        assert tags.classes == ("cat", "dog", "owl")
        for i in range(len(ds)):
            row = rows[ds.key(i)]
            np.testing.assert_array_equal(ds.field_value("boxes", i), np.asarray(row["boxes"], np.float32).reshape(-1, 4))
            assert [tags.classes[k] for k in ds.field_value("tags", i)] == sorted(row["tags"])
            assert ds.field_value("caption", i) == row["caption"]
            np.testing.assert_allclose(ds.field_value("depth", i), row["depth"])
            mask = ds.field_image("mask", i)
            source = np.asarray(Image.open(manifest.parent / row["mask"]))
            np.testing.assert_array_equal(mask, source)  # palette indices, not colours
            assert ds.field_bytes("mask", i).tobytes() == (manifest.parent / row["mask"]).read_bytes()
        depth = ds.field_array("depth")
        assert depth.shape == (len(ds), 2) and not depth.flags.writeable
        info = ds.sample_info(0)["fields"]
        assert set(info) == {"boxes", "tags", "caption", "depth", "mask"} and info["mask"]["format"] == "png"


def test_field_errors_on_read_are_typed(built: tuple[Path, Path]) -> None:
    with open_dataset(built[1]) as ds:
        with pytest.raises(OptionError, match="no field 'nope'.*boxes"):
            ds.field_value("nope", 0)
        with pytest.raises(OptionError, match="is an image"):
            ds.field_value("mask", 0)
        with pytest.raises(OptionError, match="not an image"):
            ds.field_bytes("boxes", 0)
        with pytest.raises(OptionError, match="no fixed shape"):
            ds.field_array("boxes")


def test_build_with_fields_is_deterministic_and_workers_do_not_matter(built: tuple[Path, Path], tmp_path: Path) -> None:
    manifest, out = built
    again = tmp_path / "again"
    build(manifest, again, BuildOptions(fields=FIELDS, shard_size=3 * 8192, seed=3, alignment=4096), workers=2)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again).as_posix() for p in again.rglob("*") if p.is_file())
    for name in files:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name
    assert any(name.startswith("shards/field-mask-") for name in files)


def test_rows_that_do_not_fit_are_rejected_with_a_reason(tmp_path: Path) -> None:
    manifest = make_field_source(tmp_path / "src", count=6)
    rows = [json.loads(line) for line in manifest.read_text("utf-8").splitlines()]
    rows[0]["boxes"] = [[1, 2, 3]]
    rows[1]["mask"] = "img/missing.png"
    rows[2]["caption"] = 7
    (tmp_path / "src" / "img" / "not.png").write_bytes(b"not an image at all")
    rows[3]["mask"] = "img/not.png"
    del rows[4]["mask"]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    result = build(manifest, tmp_path / "out", BuildOptions(fields=FIELDS))
    assert result.sample_count == 1
    reasons = {r.key: (r.reason, r.message) for r in result.rejected}
    assert {reason for reason, _ in reasons.values()} == {"bad-field"}
    assert "expects float32[N,4], got shape [1, 3]" in reasons["img/0.jpg"][1]
    assert "field 'mask': 'img/missing.png': file does not exist" in reasons["img/1.jpg"][1]
    assert "field 'caption' is text, got an integer" in reasons["img/2.jpg"][1]
    assert "field 'mask' (img/not.png)" in reasons["img/3.jpg"][1]
    assert "the row has no 'mask'" in reasons["img/4.jpg"][1]
    with open_dataset(tmp_path / "out") as ds:
        assert ds.key(0) == "img/5.jpg" and ds.field_value("caption", 0) == rows[5]["caption"]


def test_csv_manifest_fields_need_no_label(tmp_path: Path) -> None:
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.jpg")
    Image.fromarray(np.ones((8, 8, 3), np.uint8)).save(tmp_path / "b.jpg")
    (tmp_path / "rows.csv").write_text('path,caption,boxes,tags,extra\na.jpg,"a cat","[[0,0,4,4]]",cat|dog,x\n'
                                       'b.jpg,two,[],,y\n', "utf-8")
    out = tmp_path / "out"
    build(tmp_path / "rows.csv", out, BuildOptions(fields=("caption=text", "boxes=float32[N,4]", "tags=classes"),
                                                   shuffle=False))
    with open_dataset(out) as ds:
        assert ds.labels.tolist() == [-1, -1] and ds.classes == ()
        assert ds.field_value("caption", 0) == "a cat" and ds.field_value("boxes", 1).shape == (0, 4)
        assert ds.field_value("tags", 0).tolist() == [0, 1] and ds.field_value("tags", 1).tolist() == []
        assert ds.metadata(0) == {"extra": "x"}  # field columns are fields, not metadata


def test_resume_keeps_field_values(built: tuple[Path, Path], tmp_path: Path) -> None:
    manifest, out = built
    split = tmp_path / "split"
    options = BuildOptions(fields=FIELDS, shard_size=3 * 8192, seed=3, alignment=4096)
    build(manifest, split, options, plan_only=True)
    build(manifest, split, options, resume=True)
    assert (split / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()


def test_append_refuses_a_dataset_with_fields(built: tuple[Path, Path]) -> None:
    from packer.writer.append import append

    with pytest.raises(OptionError, match="append does not support datasets with declared fields"):
        append(built[1], built[0])


def test_cli_declares_fields(built: tuple[Path, Path], tmp_path: Path) -> None:
    from click.testing import CliRunner
    from packer.cli import _register, cli as main

    _register()

    manifest, out = built
    result = CliRunner().invoke(main, ["build", str(manifest), str(tmp_path / "cli"), "-q", "--seed", "3",
                                       "--shard-size", str(3 * 8192), "--alignment", "4096", *sum((["--field", f] for f in FIELDS), [])])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    bad = CliRunner().invoke(main, ["build", str(manifest), str(tmp_path / "bad"), "--field", "boxes=float33"])
    assert bad.exit_code == 2 and "unknown type 'float33'" in bad.output


# --- open checks (R45-R50) on hand-damaged copies -----------------------------------------------------

def _copy(out: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(out, target)
    return target


def _edit_manifest(folder: Path, change) -> None:
    document = json.loads((folder / "manifest.json").read_text("utf-8"))
    change(document)
    (folder / "manifest.json").write_text(json.dumps(document), "utf-8")


@pytest.mark.parametrize("change, error, message", [
    (lambda d: d["fields"].append(dict(d["fields"][0])), ManifestError, "unique"),
    (lambda d: d["fields"][0].update(kind="tensor"), ManifestError, "kind 'tensor'"),
    (lambda d: d["fields"][0].update(shape=[4, -1]), ManifestError, "only the first may be variable"),
    (lambda d: d["fields"][1].update(num_classes=5), ManifestError, "equal to the number of classes"),
    (lambda d: d["fields"][4]["shards"].pop(), ManifestError, "one shard per main shard"),
    (lambda d: d["fields"][4]["shards"][0].update(path="shards/field-mask-00000-../x.pks"), UnsafePathError,
     "not a valid dataset path"),
    (lambda d: d["fields"][4]["shards"].reverse(), ManifestError, "must be the 'mask' shard numbered"),
    (lambda d: d["fields"][0].update(shards=[]), ManifestError, "not an image field and lists shards"),
    (lambda d: d["fields"][3].update(shape=[3]), IndexMismatchError, "field 'depth'"),
    (lambda d: d["fields"].append({"name": "extra", "kind": "text"}), CorruptHeaderError, "lacks required column 'f_extra'"),
    (lambda d: d["fields"][0].update(shape=[-1, 3]), OverlappingRecordsError, "multiple of the field's 12-byte record"),
    (lambda d: d["fields"][1].update(num_classes=2, classes=["cat", "dog"]), IndexMismatchError, "class id 2 outside 0..1"),
])
def test_damaged_field_declarations_are_refused_at_open(built: tuple[Path, Path], tmp_path: Path, change, error,
                                                        message: str) -> None:
    copy = _copy(built[1], tmp_path)
    _edit_manifest(copy, change)
    with pytest.raises(error, match=message.replace("(", r"\(").replace("[", r"\[")):
        open_index(copy)


def test_old_readers_view_a_fields_dataset_as_images_and_labels(built: tuple[Path, Path], tmp_path: Path) -> None:
    """An index's field columns are extra columns (§5): without the declarations it still opens."""
    copy = _copy(built[1], tmp_path)
    _edit_manifest(copy, lambda d: d.pop("fields"))
    with open_index(copy) as index:
        assert index.fields == () and len(index) == 8


def test_field_shard_checksums_are_verified(built: tuple[Path, Path], tmp_path: Path) -> None:
    from packer.errors import ChecksumMismatchError

    copy = _copy(built[1], tmp_path)
    with open_dataset(copy) as ds:
        spec = ds.field_spec("mask")
        offset = int(ds.index.field_columns[spec.image_column("offset")][0])
        shard = spec.shards[int(ds.index.shard[0])].path
    data = bytearray((copy / shard).read_bytes())
    data[offset + 20] ^= 0xFF
    (copy / shard).write_bytes(bytes(data))
    with open_dataset(copy, verify_checksums=True) as ds:
        with pytest.raises(ChecksumMismatchError, match="field 'mask' checksum mismatch"):
            ds.field_bytes("mask", 0)


def test_manifest_round_trip_keeps_fields(built: tuple[Path, Path]) -> None:
    data = (built[1] / "manifest.json").read_bytes()
    manifest = fmt.parse_manifest(data)
    assert fmt.dump_manifest(manifest) == data


# --- export: fields come out as the side files a build reads back ---------------------------------

@pytest.mark.parametrize("target", ["folder", "webdataset"])
def test_export_writes_fields_as_side_files_that_rebuild_the_same_values(built: tuple[Path, Path], tmp_path: Path,
                                                                        target: str) -> None:
    from packer.export import export

    _, out = built
    exported = tmp_path / "exported"
    result = export(out, exported, to=target)
    assert result.samples == 8
    if target == "folder":
        # label 0 or 1 without class names: each sample goes under its label's folder
        assert (exported / "0" / "img" / "0.mask.png").is_file() and (exported / "0" / "img" / "0.json").is_file()
        source = exported
    else:
        source = exported / "shard-000000.tar"
    rebuilt = tmp_path / "rebuilt"
    # the WebDataset members sit in img/ like the keys: say the kind (auto would read class folders)
    build(source, rebuilt, BuildOptions(fields=FIELDS), source_kind="folder" if target == "folder" else "webdataset")
    with open_dataset(out) as before, open_dataset(rebuilt) as after:
        assert len(after) == len(before)
        for i in range(len(after)):
            key = after.key(i)
            if target == "folder":
                folder, key = key.split("/", 1)
                j = before.find(key)
                assert after.classes[after.labels[i]] == folder == str(before.labels[j])
            else:
                j = before.find(key)
                assert after.labels[i] == before.labels[j]  # from the .cls member
            for spec in before.fields:
                if spec.kind == "image":
                    assert after.field_bytes(spec.name, i).tobytes() == before.field_bytes(spec.name, j).tobytes()
                elif spec.kind == "classes":
                    names = lambda ds, k: [ds.field_spec("tags").classes[c] for c in ds.field_value("tags", k)]
                    assert names(after, i) == names(before, j)
                elif spec.kind == "text":
                    assert after.field_value(spec.name, i) == before.field_value(spec.name, j)
                else:
                    np.testing.assert_array_equal(after.field_value(spec.name, i), before.field_value(spec.name, j))


def test_export_refuses_samples_whose_side_files_would_collide(tmp_path: Path) -> None:
    from packer.export import export

    (tmp_path / "img").mkdir()
    for name in ("a.1.jpg", "a.2.jpg"):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "img" / name)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"path": f"img/{n}", "caption": n}) + "\n"
                                                 for n in ("a.1.jpg", "a.2.jpg")), "utf-8")
    build(tmp_path / "rows.jsonl", tmp_path / "out", BuildOptions(fields=("caption=text",)))
    with pytest.raises(OptionError, match="share the side-file key 'img/a'"):
        export(tmp_path / "out", tmp_path / "exported")
    assert not (tmp_path / "exported").exists()


def test_sample_indices_must_be_integers(built: tuple[Path, Path]) -> None:
    """1.7 must not silently read sample 1, nor a bool mask samples 0 and 1."""
    with open_dataset(built[1]) as ds:
        for bad in ([1.7], np.array([True, False]), ["1"]):
            with pytest.raises(SampleIndexTypeError, match="sample indices must be integers"):
                ds.read_batch(bad)
            with pytest.raises(SampleIndexTypeError, match="sample indices must be integers"):
                list(ds.iter_samples(bad))
        with pytest.raises(SampleIndexTypeError, match="past int64"):
            ds.read_batch(np.array([2**64 - 1], dtype=np.uint64))
        assert len(ds.read_batch(np.array([1, 2], dtype=np.uint32))) == 2 and len(ds.read_batch([])) == 0


# --- checksums and names --------------------------------------------------------------------------


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


# --- declared fields in the index: columns (R46), offsets (R47), class numbers (R49), images (R48) ---


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


# --- the manifest: the shard-count pre-scan (R36, R18) and field declarations with their path -----


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


# --- declarations that are not a list, schema files that cannot be read --------------------------------

def test_a_fields_schema_file_that_is_unreadable_not_json_or_not_a_list(tmp_path: Path) -> None:
    """``packer build --fields FILE``: each refusal is a usage error (exit 2) naming the file, and no
    dataset is started."""
    from click.testing import CliRunner

    from packer.cli import cli

    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(src / "a.png")
    broken = tmp_path / "broken.json"
    broken.write_text('["boxes=float32[N,4]",')
    mapping = tmp_path / "mapping.json"
    mapping.write_text('{"boxes": "float32[N,4]"}')
    missing = tmp_path / "missing.json"
    for schema, message in ((missing, f"{missing}: --fields: no such file"),
                            (broken, f"{broken}: --fields: not JSON (Expecting value: line 1 column 23"),
                            (mapping, f"--fields {mapping} must be a JSON array of field declarations")):
        done = CliRunner().invoke(cli, ["build", str(tmp_path / "src"), str(tmp_path / "out"), "--fields", str(schema)])
        assert done.exit_code == 2, done.output
        assert f"error: {message}" in done.output
        assert not (tmp_path / "out").exists()


def test_a_manifest_whose_fields_are_not_a_list_is_a_manifest_error() -> None:
    doc = manifest_doc()
    doc["fields"] = {"boxes": "float32[N,4]"}
    error = refusal(doc)
    assert isinstance(error, ManifestError)
    assert error.message == "manifest 'fields' must be an array of field declarations"
