"""Declared fields from grouped sources (#15): image folders with side files, WebDataset samples, COCO annotations."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.writer import build
from packer.sources import folder as sources
from packer.sources import SourceOptions, list_source
from packer.sources.coco import coco_categories
from packer.dataset import open_dataset
from packer.errors import EmptySourceError, OptionError, SourceError
from packer import LabelSettings, SourceSettings
from helpers import with_source
from packer import BuildSettings, LayoutSettings, RunOptions


def jpeg(seed: int, size: tuple[int, int] = (12, 16)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=80)
    return out.getvalue()


def mask_png(seed: int, size: tuple[int, int] = (12, 16)) -> bytes:
    """A palette PNG: reading it back as stored must give these exact indices."""
    image = Image.fromarray((np.arange(size[1])[None, :] % (seed + 2)).astype(np.uint8).repeat(size[0], 0), mode="P")
    image.putpalette([0, 0, 0, 255, 0, 0] * 128)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def all_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".packer.lock"}


def rejected(result) -> dict[str, tuple[str, str]]:
    return {r.key: (r.reason, r.message) for r in result.rejected}


# --- image folders with side files ------------------------------------------------------------------

FOLDER_FIELDS = ("boxes=float32[N,4]", "tags=classes", "caption=text@txt", "mask=image@mask.png")


def side_file_folder(root: Path, count: int = 4) -> Path:
    """cat/ and dog/ samples: NNN.jpg + NNN.mask.png + NNN.json (boxes, tags, extra) + NNN.txt."""
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(count):
            stem = root / name / f"{i:03d}"
            seed = 10 * c + i
            (stem.parent / f"{stem.name}.jpg").write_bytes(jpeg(seed))
            (stem.parent / f"{stem.name}.mask.png").write_bytes(mask_png(seed))
            (stem.parent / f"{stem.name}.json").write_text(json.dumps(
                {"boxes": [[i, i, i + 2.5, i + 3]] * (i % 3), "tags": ["b", "a", "c"][: i % 4], "extra": seed}))
            (stem.parent / f"{stem.name}.txt").write_text(f"a {name} number {i} ✓\n", "utf-8")
    return root


def test_folder_side_files_read_back_as_written(tmp_path: Path) -> None:
    src = side_file_folder(tmp_path / "src")
    out = tmp_path / "out"
    result = build(src, out, BuildSettings(layout=LayoutSettings(shuffle=False), labels=LabelSettings(fields=FOLDER_FIELDS)))
    assert result.sample_count == 8 and result.rejected == []
    with open_dataset(out, verify_checksums=True) as ds:
        assert [ds.key(i) for i in range(len(ds))] == [f"{c}/{i:03d}.jpg" for c in ("cat", "dog") for i in range(4)]
        assert ds.classes == ("cat", "dog") and ds.labels.tolist() == [0] * 4 + [1] * 4
        assert ds.field_spec("tags").classes == ("a", "b", "c")
        for i in range(len(ds)):
            stem = src / ds.key(i)[: -len(".jpg")]
            side = json.loads(Path(f"{stem}.json").read_text())
            np.testing.assert_array_equal(ds.field_value("boxes", i),
                                          np.asarray(side["boxes"], np.float32).reshape(-1, 4))
            assert [ds.field_spec("tags").classes[k] for k in ds.field_value("tags", i)] == sorted(side["tags"])
            assert ds.field_value("caption", i) == Path(f"{stem}.txt").read_text("utf-8").rstrip("\n")
            assert ds.field_bytes("mask", i).tobytes() == Path(f"{stem}.mask.png").read_bytes()
            np.testing.assert_array_equal(ds.field_image("mask", i), np.asarray(Image.open(f"{stem}.mask.png")))
            assert ds.read(i) == Path(f"{stem}.jpg").read_bytes()
            assert ds.metadata(i) == {"json": {"extra": side["extra"]}}  # fields' keys are stored once


def test_default_image_source_is_the_field_name_with_any_image_extension(tmp_path: Path) -> None:
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "1.jpg").write_bytes(jpeg(1))
    (tmp_path / "src" / "a" / "1.depth.png").write_bytes(mask_png(1))
    (tmp_path / "src" / "a" / "2.jpg").write_bytes(jpeg(2))
    (tmp_path / "src" / "a" / "2.depth.png").write_bytes(mask_png(2))
    (tmp_path / "src" / "a" / "2.depth.tif").write_bytes(mask_png(2))
    listing = list_source(tmp_path / "src", SourceOptions(labels=LabelSettings(fields=("depth=image",))))
    assert [listing.key(i) for i in range(len(listing))] == ["a/1.jpg"]
    assert listing.fields.image_key("depth", 0) == "a/1.depth.png"
    reason, message = {r.key: (r.reason, r.message) for r in listing.rejected}["a/2.jpg"]
    assert reason == "bad-field" and "several members match a/2.depth.<image extension>" in message


def test_folder_side_file_problems_are_rejections_with_reasons(tmp_path: Path) -> None:
    src = side_file_folder(tmp_path / "src", count=8)
    cat = src / "cat"
    (cat / "000.mask.png").unlink()                                        # field image missing
    (cat / "001.json").write_text('{"boxes": [[0, 0, NaN, 1]], "tags": []}')  # not strict JSON
    (cat / "002.json").write_text('{"boxes": [[0, 0, 1]], "tags": []}')      # wrong shape
    (cat / "003.mask.png").write_bytes(b"not a png at all")                  # field image is not an image
    (cat / "004.depth.png").write_bytes(mask_png(4))                         # a second image no field takes
    (src / "dog" / "001.npy").write_bytes(b"\x93NUMPY")                      # a member nobody takes
    (cat / "005.txt").write_bytes(b"\xff\xfe not utf-8")                     # caption not UTF-8
    (cat / "006.jpg").unlink()                                               # side files without an image
    (cat / "007.json").write_text("[" * 10_000 + "]" * 10_000)             # hostile nesting
    result = build(src, tmp_path / "out", BuildSettings(layout=LayoutSettings(shuffle=False), labels=LabelSettings(fields=FOLDER_FIELDS)))
    reasons = rejected(result)
    assert reasons["cat/000.jpg"] == ("bad-field", "field 'mask': the sample has no member cat/000.mask.png")
    assert reasons["cat/001.jpg"][0] == "bad-field" and "cat/001.json is not strict JSON: NaN" in reasons["cat/001.jpg"][1]
    assert "expects float32[N,4], got shape [1, 3]" in reasons["cat/002.jpg"][1]
    assert reasons["cat/003.jpg"][0] == "bad-field" and "field 'mask' (cat/003.mask.png)" in reasons["cat/003.jpg"][1]
    assert reasons["cat/004"][0] == "ambiguous-image" and "cat/004.depth.png, cat/004.jpg" in reasons["cat/004"][1]
    assert reasons["dog/001.npy"][0] == "unused-member"
    assert "cat/005.txt is not UTF-8 text" in reasons["cat/005.jpg"][1]
    assert reasons["cat/006"] == ("not-an-image", "the sample has no image member (suffixes json, mask.png, txt)")
    assert "nests brackets deeper than 64" in reasons["cat/007.jpg"][1]
    with open_dataset(tmp_path / "out") as ds:
        keys = {ds.key(i) for i in range(len(ds))}
    assert keys == {f"dog/{i:03d}.jpg" for i in range(8)}
    assert result.sample_count == 8


def test_side_files_grouped_even_when_not_neighbours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """'1-b.jpg' and the folder '1-d/' sort between '1' and '1.jpg': grouping is by key, not by
    adjacency; and keys whose hashes collide are still told apart."""
    folder = tmp_path / "src" / "a"
    (folder / "1-d").mkdir(parents=True)
    (folder / "1.txt").write_text("one")
    (folder / "1-b.jpg").write_bytes(jpeg(2))
    (folder / "1-b.txt").write_text("one-b")
    (folder / "1-d" / "x.jpg").write_bytes(jpeg(3))
    (folder / "1-d" / "x.txt").write_text("x")
    (folder / "1.jpg").write_bytes(jpeg(1))
    fields = LabelSettings(fields=("caption=text@txt",)).field_specs

    def listed() -> list[tuple[str, str]]:
        listing = list_source(tmp_path / "src", SourceOptions(labels=LabelSettings(fields=fields)))
        blob, offsets = listing.fields.blobs["caption"], listing.fields.offsets["caption"]
        return [(listing.key(i), blob[offsets[i]:offsets[i + 1]].tobytes().decode()) for i in range(len(listing))]

    expected = [("a/1-b.jpg", "one-b"), ("a/1-d/x.jpg", "x"), ("a/1.jpg", "one")]
    assert listed() == expected

    class Colliding:  # every key hashes alike: the keys themselves must separate the samples
        @staticmethod
        def xxh3_64_intdigest(data: bytes) -> int:
            return 7

    monkeypatch.setattr(sources, "xxhash", Colliding)
    assert listed() == expected


def test_folder_without_fields_lists_every_file_as_today(tmp_path: Path) -> None:
    """No --field: side files are not grouped; each file is a candidate, as the folder rules say."""
    src = side_file_folder(tmp_path / "src", count=2)
    with_nothing = list_source(src)
    walked = sources.list_image_folder(src)  # the door's own listing: the same keys
    assert [with_nothing.key(i) for i in range(len(with_nothing))] == [walked.key(i) for i in range(len(walked))] == [
        f"{c}/{i:03d}.{ext}" for c in ("cat", "dog") for i in range(2) for ext in ("jpg", "json", "mask.png", "txt")]
    assert with_nothing.fields is None and with_nothing.meta_blob.size == 0
    result = build(src, tmp_path / "out", BuildSettings(layout=LayoutSettings(shuffle=False)))
    assert result.sample_count == 8  # jpg and mask.png of each stem; json and txt rejected as not images
    assert {r.reason for r in result.rejected} == {"not-an-image"}


def test_non_utf8_side_file_names_are_refused_with_fields(tmp_path: Path) -> None:
    folder = tmp_path / "src" / "a"
    folder.mkdir(parents=True)
    (folder / "1.jpg").write_bytes(jpeg(1))
    (folder / "1.txt").write_text("fine")
    try:
        with open(os.path.join(os.fsencode(folder), b"2\xff.jpg"), "wb") as handle:
            handle.write(jpeg(2))
    except OSError:
        pytest.skip("this file system refuses non-UTF-8 names")
    listing = list_source(tmp_path / "src", SourceOptions(labels=LabelSettings(fields=("caption=text@txt",))))
    assert [listing.key(i) for i in range(len(listing))] == ["a/1.jpg"]
    assert [r.reason for r in listing.rejected] == ["undecodable-name"]


def test_folder_fields_deterministic_across_workers_and_resume(tmp_path: Path) -> None:
    src = side_file_folder(tmp_path / "src", count=6)
    options = BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=3 * 4096, seed=5), labels=LabelSettings(fields=FOLDER_FIELDS))
    build(src, tmp_path / "one", options)
    build(src, tmp_path / "two", options, RunOptions(workers=2))
    first = all_files(tmp_path / "one")
    assert first == all_files(tmp_path / "two")
    assert sum(name.startswith("shards/field-mask-") for name in first) > 1
    build(src, tmp_path / "split", options, RunOptions(plan_only=True))
    build(src, tmp_path / "split", options, RunOptions(resume=True))
    assert all_files(tmp_path / "split") == first


# --- WebDataset ---------------------------------------------------------------------------------------

WDS_FIELDS = ("boxes=float32[N,4]", "caption=text@txt", "mask=image@mask.png")


def write_shard(path: Path, members: list[tuple[str, bytes]], mode: str = "w") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def wds_members(first: int, count: int) -> list[tuple[str, bytes]]:
    members = []
    for i in range(first, first + count):
        key = f"s{i:04d}"
        members += [(f"{key}.jpg", jpeg(i)), (f"{key}.json", json.dumps(
                        {"label": i % 3, "boxes": [[0, 1, 2 + i, 3]] * (i % 2), "note": f"n{i}"}).encode()),
                    (f"{key}.mask.png", mask_png(i)), (f"{key}.txt", f"caption {i}".encode())]
    return members


@pytest.mark.parametrize("mode, suffix", [("w", "tar"), ("w:gz", "tar.gz")])
def test_webdataset_fields_read_back_as_written(tmp_path: Path, mode: str, suffix: str) -> None:
    """Image-field members are read by offset from the tar (or the spool of a compressed one)."""
    shards = [write_shard(tmp_path / f"train-{n}.{suffix}", wds_members(5 * n, 5), mode) for n in range(2)]
    source = f"{tmp_path}/train-{{0..1}}.{suffix}"
    out = tmp_path / "out"
    result = build(source, out, BuildSettings(layout=LayoutSettings(alignment=4096, shuffle=False, shard_size=4 * 4096), labels=LabelSettings(fields=WDS_FIELDS)))
    assert result.sample_count == 10 and result.rejected == [] and shards
    with open_dataset(out, verify_checksums=True) as ds:
        assert len(ds.manifest.shards) > 1
        for i in range(len(ds)):
            n = int(ds.key(i)[1:5])
            assert ds.key(i) == f"s{n:04d}.jpg" and ds.labels[i] == n % 3
            assert ds.read(i) == jpeg(n)
            assert ds.field_bytes("mask", i).tobytes() == mask_png(n)
            np.testing.assert_array_equal(ds.field_value("boxes", i),
                                          np.asarray([[0, 1, 2 + n, 3]] * (n % 2), np.float32).reshape(-1, 4))
            assert ds.field_value("caption", i) == f"caption {n}"
            assert ds.metadata(i) == {"json": {"label": n % 3, "note": f"n{n}"}}


def test_webdataset_field_problems_are_rejections(tmp_path: Path) -> None:
    members = wds_members(0, 6)
    members = [m for m in members if m[0] != "s0000.mask.png"]                       # mask missing
    members = [(n, b"GIF89a broken" if n == "s0001.mask.png" else d) for n, d in members]  # mask not an image
    members = [(n, b'{"boxes": "many"}' if n == "s0002.json" else d) for n, d in members]   # wrong type
    members.insert(members.index(("s0003.txt", b"caption 3")), ("s0003.extra.npy", b"\x93NUMPY"))
    members.insert(members.index(("s0004.txt", b"caption 4")), ("s0004.left.png", mask_png(4)))
    shard = write_shard(tmp_path / "shard.tar", members)
    result = build(shard, tmp_path / "out", BuildSettings(layout=LayoutSettings(shuffle=False), labels=LabelSettings(fields=WDS_FIELDS)))
    reasons = rejected(result)
    assert reasons["s0000.jpg"] == ("bad-field", "field 'mask': the sample has no member s0000.mask.png")
    assert reasons["s0001.jpg"][0] == "bad-field" and "field 'mask' (s0001.mask.png)" in reasons["s0001.jpg"][1]
    assert "field 'boxes' expects float32[N,4], got a string" in reasons["s0002.jpg"][1]
    assert reasons["s0003.extra.npy"][0] == "unused-member"
    assert reasons["s0004"][0] == "ambiguous-image"
    with open_dataset(tmp_path / "out") as ds:
        assert sorted(ds.key(i) for i in range(len(ds))) == ["s0003.jpg", "s0005.jpg"]


def test_webdataset_repeated_keys_keep_fields_aligned(tmp_path: Path) -> None:
    """A key repeated in a later shard is dropped with its field values and member locations."""
    write_shard(tmp_path / "train-0.tar", wds_members(0, 4))
    write_shard(tmp_path / "train-1.tar", wds_members(2, 4))  # s0002, s0003 again
    result = build(f"{tmp_path}/train-{{0..1}}.tar", tmp_path / "out", BuildSettings(layout=LayoutSettings(shuffle=False), labels=LabelSettings(fields=WDS_FIELDS)))
    assert sorted(r.key for r in result.rejected if r.reason == "duplicate-entry") == ["s0002.jpg", "s0003.jpg"]
    with open_dataset(tmp_path / "out", verify_checksums=True) as ds:
        assert [ds.key(i) for i in range(len(ds))] == [f"s{n:04d}.jpg" for n in range(6)]
        for i in range(len(ds)):
            assert ds.field_bytes("mask", i).tobytes() == mask_png(i) and ds.field_value("caption", i) == f"caption {i}"


def test_webdataset_without_fields_survives_hostile_json(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "shard.tar", [("a.jpg", jpeg(1)), ("a.json", b"[" * 100_000),
                                                 ("b.jpg", jpeg(2)), ("b.cls", b"3")])
    listing = list_source(shard)
    assert [listing.key(i) for i in range(len(listing))] == ["a.jpg", "b.jpg"] and listing.labels.tolist() == [-1, 3]
    assert [(r.key, r.reason) for r in listing.rejected] == [("a.json", "bad-manifest-row")]


def test_webdataset_fields_deterministic_and_resumable(tmp_path: Path) -> None:
    write_shard(tmp_path / "train-0.tar", wds_members(0, 6))
    write_shard(tmp_path / "train-1.tar", wds_members(6, 6))
    source = f"{tmp_path}/train-{{0..1}}.tar"
    options = BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=3 * 4096, seed=9), labels=LabelSettings(fields=WDS_FIELDS))
    build(source, tmp_path / "one", options)
    build(source, tmp_path / "two", options, RunOptions(workers=2))
    first = all_files(tmp_path / "one")
    assert first == all_files(tmp_path / "two")
    build(source, tmp_path / "split", options, RunOptions(plan_only=True))  # the member table's field rows travel in the plan
    build(source, tmp_path / "split", options, RunOptions(resume=True))
    assert all_files(tmp_path / "split") == first


def test_class_tars_and_zips_refuse_fields(tmp_path: Path) -> None:
    tar = write_shard(tmp_path / "classes.tar", [("cat/1.jpg", jpeg(1)), ("cat/1.png", mask_png(1))])
    with pytest.raises(OptionError, match="a tar of class folders .* does not take declared fields"):
        list_source(tar, SourceOptions(source=SourceSettings(kind="tar"), labels=LabelSettings(fields=("mask=image",))))


# --- COCO ------------------------------------------------------------------------------------------------

def coco_source(root: Path, *, annotations: list | None = None, images: list | None = None,
                categories: list | None = None, extra: dict | None = None) -> tuple[Path, Path]:
    """train/ with 5 images (100..104) and ann/instances.json; categories 18 'dog', 1 'person', 5 'car'."""
    (root / "train").mkdir(parents=True)
    (root / "ann").mkdir()
    default_images = []
    for i in range(5):
        (root / "train" / f"{i:012d}.jpg").write_bytes(jpeg(i, (20, 30)))
        default_images.append({"id": 100 + i, "file_name": f"{i:012d}.jpg", "width": 30, "height": 20})
    default_annotations = [
        {"id": 1, "image_id": 100, "category_id": 18, "bbox": [1, 2, 3, 4], "area": 11.5, "iscrowd": 0},
        {"id": 2, "image_id": 100, "category_id": 1, "bbox": [0.5, 0, 10, 5.25], "iscrowd": 1},
        {"id": 3, "image_id": 101, "category_id": 5, "bbox": [5, 5, 2, 2], "area": 3},
        {"id": 4, "image_id": 103, "category_id": 1, "bbox": [0, 0, 0, 0], "area": 0.0, "segmentation": [[0, 0]]},
    ]
    document = {"info": {}, "images": default_images if images is None else images,
                "annotations": default_annotations if annotations is None else annotations,
                "categories": [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"}, {"id": 5, "name": "car"}]
                if categories is None else categories, **(extra or {})}
    path = root / "ann" / "instances.json"
    path.write_text(json.dumps(document), "utf-8")
    return path, root / "train"


def test_coco_round_trip_boxes_are_xyxy_pixels(tmp_path: Path) -> None:
    annotations, images = coco_source(tmp_path / "src")
    out = tmp_path / "out"
    result = build(annotations, out, BuildSettings(source=SourceSettings(root=images), layout=LayoutSettings(shuffle=False)))
    assert result.sample_count == 5 and result.rejected == []
    with open_dataset(out, verify_checksums=True) as ds:
        assert [spec.describe() for spec in ds.fields] == ["boxes: float32[N,4]", "labels: int64[N]",
                                                          "iscrowd: uint8[N]", "area: float32[N]", "image_id: int64"]
        assert ds.classes == () and ds.labels.tolist() == [-1] * 5
        assert coco_categories(ds.field_spec("labels").source) == [(1, "person"), (5, "car"), (18, "dog")]
        with pytest.raises(OptionError) as caught:  # another field's source
            coco_categories(ds.field_spec("boxes").source)
        assert caught.value.message == ("expected the source of a COCO-built labels field ('coco:...; categories "
                                        f"[...]'), got {ds.field_spec('boxes').source[:80]!r}")
        assert ds.field_spec("labels").classes == ("person", "car", "dog")  # names of the label values
        assert "XYXY" in ds.field_spec("boxes").source
        assert [ds.key(i) for i in range(5)] == [f"{i:012d}.jpg" for i in range(5)]
        assert [int(ds.field_value("image_id", i)) for i in range(5)] == [100, 101, 102, 103, 104]
        np.testing.assert_array_equal(ds.field_value("boxes", 0), np.float32([[1, 2, 4, 6], [0.5, 0, 10.5, 5.25]]))
        assert ds.field_value("labels", 0).tolist() == [2, 0]  # dog (id 18) is label 2, person (id 1) label 0
        assert ds.field_value("iscrowd", 0).tolist() == [0, 1]
        np.testing.assert_allclose(ds.field_value("area", 0), [11.5, 52.5])  # absent area: width * height
        assert ds.field_value("labels", 1).tolist() == [1] and ds.field_value("area", 1).tolist() == [3.0]
        assert ds.field_value("boxes", 2).shape == (0, 4) and ds.field_value("labels", 2).shape == (0,)  # no objects
        assert ds.field_value("boxes", 3).tolist() == [[0, 0, 0, 0]]  # degenerate, kept as written
        assert ds.read(4) == (images / "000000000004.jpg").read_bytes()


def test_coco_is_recognised_by_content(tmp_path: Path) -> None:
    annotations, images = coco_source(tmp_path / "src")
    renamed = annotations.with_name("instances_val")  # no suffix at all
    annotations.rename(renamed)
    listing = list_source(renamed, SourceOptions(source=SourceSettings(root=images)))
    assert listing.kind == "coco" and len(listing) == 5


@pytest.mark.parametrize("change, message", [
    (lambda p: p.write_text("[1, 2]"), "this one is a list"),
    (lambda p: p.write_text('{"images": [], "annotations": []}'), r"lacks \['categories'\]"),
    (lambda p: p.write_text('{"images": {}, "annotations": [], "categories": []}'), "'images' must be an array"),
    (lambda p: p.write_text('{"images": [], "annotations": 3, "categories": []}'), "'annotations' must be an array"),
    (lambda p: p.write_text('{"images": [], "categories": [{"id": "1", "name": "x"}]}'), r"categories\[0\] must be"),
    (lambda p: p.write_text('{"images": [], "categories": [{"id": 1, "name": "x"}, {"id": 1, "name": "y"}]}'),
     "id 1 repeats"),
    (lambda p: p.write_text('{"images": [], "categories": [{"id": 1, "name": "x"}, {"id": 2, "name": "x"}]}'),
     "category names repeat"),
    (lambda p: p.write_text('{"images": [] "categories"'), "not a JSON document"),
    (lambda p: p.write_text('{"path": "a.jpg"}\n{"path": "b.jpg"}\n'), "must be named .jsonl"),
    (lambda p: p.write_text('{"images": ' + "[" * 200_000 + "]" * 200_000 + "}"), "nests arrays or objects too"),
    (lambda p: p.write_bytes(b'{"images": [], "categories": [], "x": "\xff"}'), "not a JSON document"),
])
def test_hostile_coco_documents_are_source_errors(tmp_path: Path, change, message: str) -> None:
    annotations, images = coco_source(tmp_path / "src")
    change(annotations)
    with pytest.raises(SourceError, match=message):
        list_source(annotations, SourceOptions(source=SourceSettings(root=images)))


def test_a_deep_coco_document_in_utf16_is_refused_by_the_parse_itself(tmp_path: Path) -> None:
    """json.loads reads UTF-16 as well as UTF-8, but the depth scan that runs before it counts the
    bytes as UTF-8: in UTF-16-LE '∀' is the bytes 00 22, a quote to the scan, which then takes
    every bracket after it for string text. The parse's own RecursionError is what refuses such a
    document (coco._load's second guard), as one line of the CLI, not a traceback."""
    from click.testing import CliRunner

    from packer.cli import _register, cli

    annotations, images = coco_source(tmp_path / "src")
    depth = 100_000
    annotations.write_bytes(('{"images": [], "categories": [], "note": ["∀", ' + "[" * depth + "]" * depth + "]}")
                            .encode("utf-16-le"))
    with pytest.raises(SourceError) as caught:
        list_source(annotations, SourceOptions(source=SourceSettings(root=images)))
    assert type(caught.value) is SourceError and caught.value.path == str(annotations)
    assert caught.value.message == "the annotation file nests arrays or objects too deeply to be COCO"
    _register()
    done = CliRunner().invoke(cli, ["build", str(annotations), str(tmp_path / "out"), "--root", str(images)])
    assert done.exit_code == 2, done.output
    assert done.output.strip() == f"error: {annotations}: the annotation file nests arrays or objects too deeply to be COCO"
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_hostile_coco_entries_are_rejections_with_reasons(tmp_path: Path) -> None:
    base = {"category_id": 1, "bbox": [0, 0, 1, 1]}
    bad = {
        100: {"bbox": [0, 0, float("nan"), 1]},
        101: {"bbox": [0, 0, -2, 1]},
        102: {"bbox": [0, "1", 1, 1]},
        103: {"bbox": [0, 0, 1e39, 1]},
        104: {"bbox": [0, 0, 10 ** 400, 1]},
        105: {"bbox": [True, 0, 1, 1]},
        106: {"category_id": 77},
        107: {"iscrowd": 2},
        108: {"area": -1},
        109: {"area": float("inf")},
        110: {"bbox": [0, 0, 1]},
    }
    messages = {100: "not finite", 101: "negative width or height", 102: "four numbers", 103: "too large for float32",
                104: "too large for float32", 105: "four numbers", 106: "category_id 77 is not in categories",
                107: "iscrowd must be 0 or 1", 108: "area must be a finite number >= 0", 109: "area must be a finite",
                110: "four numbers"}
    images = [{"id": i, "file_name": f"{i % 5:012d}.jpg" if i < 105 else f"copy-{i}.jpg"} for i in range(100, 111)]
    images += [{"id": 200, "file_name": "000000000000.jpg"},                    # the same file again
               {"id": "201", "file_name": "000000000001.jpg"},                 # id is not an integer
               {"id": 1 << 70, "file_name": "000000000001.jpg"},               # id past int64
               {"id": 202, "file_name": "../outside.jpg"},
               {"id": 203, "file_name": "missing.jpg"},
               {"id": 200, "file_name": "copy-dup.jpg"},                       # repeated id
               {"id": 204, "file_name": "000000000003.jpg"},                   # a good one, kept
               "not an object"]
    annotations = [{**base, "id": n, "image_id": i, **change} for n, (i, change) in enumerate(bad.items())]
    annotations += [{**base, "id": 50, "image_id": 999}, ["not", "an", "object"],
                    {**base, "id": 51, "image_id": 204}, {**base, "id": 52, "image_id": True}]
    path, root = coco_source(tmp_path / "src", annotations=annotations, images=images)
    for i in range(105, 111):
        (root / f"copy-{i}.jpg").write_bytes(jpeg(i))
    listing = list_source(path, SourceOptions(source=SourceSettings(root=root)))
    reasons = {r.key: (r.reason, r.message) for r in listing.rejected}
    for image_id, expected in messages.items():
        name = f"{image_id % 5:012d}.jpg" if image_id < 105 else f"copy-{image_id}.jpg"
        reason, message = reasons[name]
        assert reason == "bad-annotation" and expected in message and "the image is not packed" in message, name
    assert reasons["annotations[11]"] == ("bad-annotation", "annotation 50: image_id 999 is not in images (dropped)")
    assert reasons["annotations[12]"][0] == "bad-annotation" and "must be an object" in reasons["annotations[12]"][1]
    assert "image_id True is not in images" in reasons["annotations[14]"][1]
    assert reasons["images[12]"][0] == "bad-manifest-row" and reasons["images[13]"][0] == "bad-manifest-row"
    assert reasons["images[18]"][0] == "bad-manifest-row"
    assert reasons["../outside.jpg"][0] == "outside-root" and reasons["missing.jpg"][0] == "missing"
    assert reasons["copy-dup.jpg"][0] == "duplicate-entry" and "image id 200 repeats" in reasons["copy-dup.jpg"][1]
    # the image of id 200 is the same file as id 100's: only the first is packed (100 was rejected anyway)
    assert [listing.key(i) for i in range(len(listing))] == ["000000000000.jpg", "000000000003.jpg"]
    image_ids = np.frombuffer(listing.fields.blobs["image_id"].tobytes(), "<i8").tolist()
    assert image_ids == [200, 204]


def test_coco_builds_are_deterministic_and_resumable(tmp_path: Path) -> None:
    annotations, images = coco_source(tmp_path / "src")
    options = BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=2 * 4096, seed=1))
    build(annotations, tmp_path / "one", with_source(options, root=images))
    build(annotations, tmp_path / "two", with_source(options, root=images), RunOptions(workers=2))
    first = all_files(tmp_path / "one")
    assert first == all_files(tmp_path / "two")
    build(annotations, tmp_path / "split", with_source(options, root=images), RunOptions(plan_only=True))
    build(annotations, tmp_path / "split", with_source(options, root=images), RunOptions(resume=True))
    assert all_files(tmp_path / "split") == first


def test_coco_without_root_says_to_pass_it(tmp_path: Path) -> None:
    annotations, _ = coco_source(tmp_path / "src")
    with pytest.raises(EmptySourceError, match="pass the image folder, e.g. --root train2017/"):
        list_source(annotations)
    with pytest.raises(OptionError) as caught:
        list_source(annotations, SourceOptions(labels=LabelSettings(fields=("boxes=float32[N,4]",))))
    assert caught.value.message == ("--field: a COCO annotation file (it declares its own fields: boxes, labels, "
                                    "iscrowd, area, image_id) does not take declared fields; fields come from a "
                                    "CSV/JSONL manifest, an image folder with side files, or a WebDataset")
    with pytest.raises(OptionError, match="--classes does not apply to a COCO source"):
        list_source(annotations, SourceOptions(labels=LabelSettings(classes=("dog",))))


def test_cli_builds_a_coco_source(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from packer.cli import _register, cli as main

    _register()
    annotations, images = coco_source(tmp_path / "src")
    result = CliRunner().invoke(main, ["build", str(annotations), str(tmp_path / "out"), "--root", str(images)])
    assert result.exit_code == 0, result.output
    assert "labels: none (-1); the objects' categories are the 'labels' field" in result.output
    with open_dataset(tmp_path / "out") as ds:
        assert len(ds) == 5 and ds.field_spec("boxes").kind == "array"


def test_named_integer_values_out_of_range_are_refused_at_open(tmp_path: Path) -> None:
    """R49 for an integer array with classes: a per-box label past the names is refused at open."""
    import shutil

    from packer.dataset import open_index
    from packer.errors import IndexMismatchError

    annotations, images = coco_source(tmp_path / "src")
    out = tmp_path / "out"
    build(annotations, out, BuildSettings(source=SourceSettings(root=images), layout=LayoutSettings(shuffle=False)))
    document = json.loads((out / "manifest.json").read_text("utf-8"))
    labels = next(f for f in document["fields"] if f["name"] == "labels")
    labels["classes"] = labels["classes"][:2]  # label 2 (dog) now names no class
    (out / "manifest.json").write_text(json.dumps(document), "utf-8")
    with pytest.raises(IndexMismatchError, match="field 'labels' holds value 2, not a class number 0..1"):
        open_index(out)
    labels["classes"] = ["a", "a", "b"]
    (out / "manifest.json").write_text(json.dumps(document), "utf-8")
    from packer.errors import ManifestError
    with pytest.raises(ManifestError, match="unique strings"):
        open_index(out)
    shutil.rmtree(out)


# --- text that is not Unicode: JSON's unpaired surrogate escapes ------------------------------

def test_unpaired_surrogate_escapes_are_rejections_not_crashes(tmp_path: Path) -> None:
    """``"\\ud800"`` is valid JSON syntax but not text: as a class name, a key or a value no report
    or manifest could hold it (a build crashed with UnicodeEncodeError while writing them)."""
    from packer.sources.strictjson import lone_surrogate, parse_strict_json
    assert parse_strict_json('{"a": "\\ud83d\\ude00"}') == {"a": "\U0001F600"}  # a pair is one character
    assert parse_strict_json('{"a": "\\\\ud800"}') == {"a": "\\ud800"}  # an escaped backslash, not an escape
    for text in ('{"label": "\\ud800x"}', '{"k\\udfff": 1}', '{"m": [{"deep": "\\udc00"}]}', '"\\ud83d"'):
        with pytest.raises(ValueError, match="holds an unpaired surrogate escape"):
            parse_strict_json(text)
    assert lone_surrogate({"a": ["ok", {"b": "c"}]}) is None
    assert lone_surrogate({"a": ["ok", {"b\ud800": "c"}]}) == "b\ud800"

    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.jpg", "b.jpg"):
        (src / name).write_bytes(jpeg(1))
    manifest = src / "m.jsonl"
    manifest.write_text('{"path": "a.jpg", "label": "\\ud800x"}\n{"path": "b.jpg", "label": "dog"}\n', "utf-8")
    result = build(manifest, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
    assert result.sample_count == 1
    assert [(r.key, r.reason) for r in result.rejected] == [("m.jsonl:1", "bad-manifest-row")]
    assert "unpaired surrogate" in result.rejected[0].message
    with open_dataset(tmp_path / "out") as ds:
        assert ds.classes == ("dog",)


def test_coco_names_with_unpaired_surrogates(tmp_path: Path) -> None:
    images = [{"id": 100, "file_name": "a\ud800.jpg"}, {"id": 101, "file_name": "000000000001.jpg"}]
    path, root = coco_source(tmp_path / "src", images=images, annotations=[])
    listing = list_source(path, SourceOptions(source=SourceSettings(root=root)))
    assert [(r.key, r.reason) for r in listing.rejected] == [("images[0]", "undecodable-name")]
    assert listing.rejected[0].message == "file_name 'a\\ud800.jpg' holds an unpaired surrogate escape (not a file name)"
    assert [listing.key(i) for i in range(len(listing))] == ["000000000001.jpg"]
    result = build(path, tmp_path / "out", BuildSettings(source=SourceSettings(root=root)), RunOptions(workers=1))  # the report can be written
    assert result.sample_count == 1
    path, root = coco_source(tmp_path / "src2", categories=[{"id": 1, "name": "dog\udfff"}])
    with pytest.raises(SourceError) as caught:
        list_source(path, SourceOptions(source=SourceSettings(root=root)))
    assert caught.value.message == ("categories[0] name 'dog\\udfff' holds an unpaired surrogate escape "
                                    "(not Unicode text)")
