"""Declared fields (formats/SPEC.md §14): declarations, value encoding, build, read, and the open checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.writer import BuildOptions, build
from packer.dataset import open_dataset, open_index
from packer.errors import (CorruptHeaderError, IndexMismatchError, ManifestError, OptionError,
                           OverlappingRecordsError, UnsafePathError)
from packer.fields import (FieldSpec, FieldValueError, decode_value, encode_value, multi_hot, parse_field_option,
                           parse_fields_schema, ClassVocabulary)
from helpers import FIELDS, make_field_source


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
    build(manifest, out, BuildOptions(fields=FIELDS, shard_size=3 * 8192, seed=3))
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
    build(manifest, again, BuildOptions(fields=FIELDS, shard_size=3 * 8192, seed=3), workers=2)
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
    options = BuildOptions(fields=FIELDS, shard_size=3 * 8192, seed=3)
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
                                       "--shard-size", str(3 * 8192), *sum((["--field", f] for f in FIELDS), [])])
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
            with pytest.raises(TypeError, match="sample indices must be integers"):
                ds.read_batch(bad)
            with pytest.raises(TypeError, match="sample indices must be integers"):
                list(ds.iter_samples(bad))
        with pytest.raises(TypeError, match="past int64"):
            ds.read_batch(np.array([2**64 - 1], dtype=np.uint64))
        assert len(ds.read_batch(np.array([1, 2], dtype=np.uint32))) == 2 and len(ds.read_batch([])) == 0
