"""inspect on datasets with declared fields: the field table and statistics (JSON and text), and the
contact sheet's box outlines and mask overlays, checked pixel by pixel."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.writer import BuildOptions, build
from packer.dataset import open_dataset, open_index
from packer.errors import OptionError
from packer.fields import parse_field_option
from packer.inspect import fields as inspect_fields
from packer.inspect.grid import BOX_COLOUR, MASK_ALPHA, contact_sheet, mask_colours, overlay_fields
from packer.inspect.summary import format_summary, summarize
from helpers import FIELDS, make_field_source
from helpers import rewrite_index


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("inspect-fields")
    manifest = make_field_source(root / "src")
    build(manifest, root / "ds", BuildOptions(fields=FIELDS, shard_size=3 * 8192, seed=3, alignment=4096), workers=1, progress=False)
    rows = [json.loads(line) for line in manifest.read_text("utf-8").splitlines()]
    return rows, root / "ds"


def _by_name(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in summary["fields"]}


# --- the summary ----------------------------------------------------------------------------------

def test_field_table(built: tuple[list[dict[str, Any]], Path]) -> None:
    fields = summarize(built[1])["fields"]
    table = [{k: f[k] for k in ("name", "kind", "type", "dtype", "shape", "variable", "source")} for f in fields]
    assert table == [
        {"name": "boxes", "kind": "array", "type": "float32[N,4]", "dtype": "float32", "shape": [-1, 4],
         "variable": True, "source": "boxes"},
        {"name": "tags", "kind": "classes", "type": "classes(3)", "dtype": "int64", "shape": None, "variable": True,
         "source": "tags"},
        {"name": "caption", "kind": "text", "type": "text", "dtype": None, "shape": None, "variable": True,
         "source": "caption"},
        {"name": "depth", "kind": "array", "type": "float32[2]", "dtype": "float32", "shape": [2], "variable": False,
         "source": "depth"},
        {"name": "mask", "kind": "image", "type": "image", "dtype": None, "shape": None, "variable": False,
         "source": "mask"},
    ]
    assert fields[1]["num_classes"] == 3


def test_array_statistics_match_the_source(built: tuple[list[dict[str, Any]], Path]) -> None:
    rows, out = built
    stats = _by_name(summarize(out))
    counts = np.array([len(r["boxes"]) for r in rows])
    boxes = np.concatenate([np.asarray(r["boxes"], np.float32).reshape(-1, 4) for r in rows])
    got = stats["boxes"]
    assert got["rows"]["min"] == counts.min() and got["rows"]["max"] == counts.max()
    assert got["rows"]["median"] == int(np.percentile(counts, 50, method="lower"))
    assert got["rows"]["total"] == len(boxes) and got["rows"]["empty"] == int((counts == 0).sum())
    assert got["values"]["count"] == boxes.size and got["values"]["non_finite"] == 0
    for c, column in enumerate(got["values"]["columns"]):
        assert column["column"] == c and column["count"] == len(boxes)
        assert (column["min"], column["max"]) == (float(boxes[:, c].min()), float(boxes[:, c].max()))
        assert column["mean"] == pytest.approx(float(boxes[:, c].mean()))
    depth = np.array([r["depth"] for r in rows], np.float32)
    columns = stats["depth"]["values"]["columns"]
    assert "rows" not in stats["depth"] and len(columns) == 2
    assert [c["max"] for c in columns] == [float(v) for v in depth.max(axis=0)]
    assert stats["depth"]["index_bytes"] == len(rows) * 8


def test_classes_text_and_image_statistics(built: tuple[list[dict[str, Any]], Path]) -> None:
    rows, out = built
    stats = _by_name(summarize(out))
    tags = stats["tags"]
    per_sample = [len(set(r["tags"])) for r in rows]
    frequency: dict[str, int] = {}
    for r in rows:
        for tag in set(r["tags"]):
            frequency[tag] = frequency.get(tag, 0) + 1
    assert [(t["name"], t["count"]) for t in tags["top"]] == sorted(frequency.items(), key=lambda kv: (-kv[1], kv[0]))
    assert tags["labels"] == sum(per_sample) and tags["empty"] == per_sample.count(0)
    assert tags["labels_per_sample"]["max"] == max(per_sample) and tags["classes_used"] == 3
    caption = stats["caption"]
    lengths = [len(r["caption"].encode()) for r in rows]
    assert (caption["length_bytes"]["min"], caption["length_bytes"]["max"]) == (min(lengths), max(lengths))
    with open_index(out) as index:
        example = caption["example"]
        assert example["text"] == index.field_value("caption", example["sample"]) and not example["truncated"]
        assert example["key"] == index.key(example["sample"])
        heights = index.index.field_columns["f_mask__height"].tolist()
        mask_bytes = sum(s.size for s in index.field_spec("mask").shards)
    mask = stats["mask"]
    assert mask["formats"] == {"png": 8} and mask["channels"] == {"1": 8} and mask["shards"] >= 2
    assert (mask["height"]["min"], mask["height"]["max"]) == (min(heights), max(heights))
    assert mask["shard_bytes"] == mask_bytes and summarize(out)["bytes"]["field_shards"] == mask_bytes


def test_non_finite_values_are_counted_and_left_out(built: tuple[list[dict[str, Any]], Path], tmp_path: Path) -> None:
    copy = Path(shutil.copytree(built[1], tmp_path / "ds"))

    def change(columns: dict[str, np.ndarray]) -> None:
        depth = columns["f_depth"].view("<f4")
        depth[0], depth[2] = np.nan, np.inf  # column 0 of samples 0 and 1

    rewrite_index(copy, change)
    with open_index(copy) as index:
        depth = index.field_array("depth").astype(np.float64)
    column = _by_name(summarize(copy))["depth"]["values"]
    assert column["non_finite"] == 2
    first = column["columns"][0]
    assert first["count"] == 6 and first["max"] == float(np.nanmax(depth[2:, 0]))
    assert first["mean"] == pytest.approx(float(depth[2:, 0].mean()))
    assert "2 NaN or infinite value(s)" in format_summary(summarize(copy))


def test_statistics_walk_bounded_chunks(built: tuple[list[dict[str, Any]], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    whole = summarize(built[1])["fields"]
    monkeypatch.setattr(inspect_fields, "CHUNK_BYTES", 16)  # one box (or two depth values) per step
    assert summarize(built[1])["fields"] == whole


def test_huge_class_counts_use_the_sparse_path() -> None:
    ids = np.array([5, 9, 5, 1 << 30, 9, 5], dtype="<i8")
    offsets = np.array([0, 16, 24, 40, 48], dtype="<u8")
    small = parse_field_option("tags=classes(2000000000)")
    got = inspect_fields._classes_stats(small, ids.view(np.uint8), offsets)
    assert [(t["id"], t["count"]) for t in got["top"]] == [(5, 3), (9, 2), (1 << 30, 1)]
    assert got["classes_used"] == 3 and got["labels_per_sample"]["max"] == 2
    dense = parse_field_option("tags=classes(12)")
    ids_dense = np.array([5, 9, 5, 11, 9, 5], dtype="<i8")
    got = inspect_fields._classes_stats(dense, ids_dense.view(np.uint8), offsets)
    assert [(t["id"], t["count"]) for t in got["top"]] == [(5, 3), (9, 2), (11, 1)]


def test_format_summary_shows_the_fields(built: tuple[list[dict[str, Any]], Path]) -> None:
    text = format_summary(summarize(built[1]))
    assert "fields     5 declared" in text
    assert "  boxes    array    float32[N,4]  from boxes" in text
    assert "  mask     image    image         from mask, " in text
    assert "rows per sample min 0, median 1, max 2" in text
    assert "top cat 6, dog 4, owl 2" in text
    assert "length (UTF-8 bytes) min 20" in text and "e.g. sample 0: 'a photo number" in text
    assert "formats png 8; channels 1: 8" in text and "image fields' shards" in text


def test_a_dataset_without_fields_shows_none(tmp_path: Path) -> None:
    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "src" / "a" / "0.png")
    build(tmp_path / "src", tmp_path / "ds", BuildOptions(), workers=1, progress=False)
    summary = summarize(tmp_path / "ds")
    assert summary["fields"] == [] and summary["bytes"]["field_shards"] == 0
    assert not any(line.startswith("fields ") for line in format_summary(summary).splitlines())
    assert "image fields" not in format_summary(summary)


def _cli(*args: str) -> Any:
    from packer.cli import _register, cli

    _register()
    return CliRunner().invoke(cli, list(args))


def test_cli_json_and_text(built: tuple[list[dict[str, Any]], Path]) -> None:
    result = _cli("inspect", str(built[1]), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [f["name"] for f in document["fields"]] == ["boxes", "tags", "caption", "depth", "mask"]
    text = _cli("inspect", str(built[1]))
    assert text.exit_code == 0 and "fields     5 declared" in text.output
    one = _cli("inspect", str(built[1]), "--sample", "1")
    assert one.exit_code == 0
    with open_index(built[1]) as index:
        caption = index.field_value("caption", 1)
    assert f'caption    "{caption}"' in one.output and "mask       png " in one.output


# --- the contact sheet ---------------------------------------------------------------------------------

GREY = 128
SIDE = 40
THUMB = SIDE + 2  # a 40x40 image fills its cell unscaled: sheet pixel = image pixel + 1


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two grey 40x40 PNGs; boxes (xyxy) and a palette mask whose left half is 1, right half 0."""
    root = tmp_path_factory.mktemp("grid-fields")
    rows = []
    for i in range(2):
        Image.fromarray(np.full((SIDE, SIDE, 3), GREY, np.uint8)).save(root / f"{i}.png")
        values = np.zeros((SIDE // 2, SIDE // 2), np.uint8)  # half the image's size: scaled up, nearest
        values[:, : SIDE // 4] = 1
        mask = Image.fromarray(values, mode="P")
        mask.putpalette([0, 0, 0, 255, 255, 255] * 128)
        mask.save(root / f"{i}.mask.png")
        rows.append({"path": f"{i}.png", "label": i, "bbox": [[10, 10, 30, 30]] if i == 0 else [],
                     "seg": f"{i}.mask.png", "other": [[0, 0, 1, 1]]})
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    build(root / "rows.jsonl", root / "ds", BuildOptions(fields=("bbox=float32[N,4]", "seg=image",
                                                                 "other=float32[N,4]"), shuffle=False),
          workers=1, progress=False)
    return root / "ds"


def _sheet(dataset: Path, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
    png = io.BytesIO()
    with open_dataset(dataset) as ds:
        result = contact_sheet(ds, png, indices=[0], columns=1, thumb=THUMB, **kwargs)
    return np.asarray(Image.open(io.BytesIO(png.getvalue())).convert("RGB")), result


def _tinted(colour: tuple[int, ...]) -> np.ndarray:
    alpha = MASK_ALPHA / 255
    return np.array(colour[:3]) * alpha + GREY * (1 - alpha)


def test_boxes_are_outlined_where_the_box_is(drawn: Path) -> None:
    sheet, result = _sheet(drawn, mask=None)
    assert result["boxes"] == "bbox" and result["boxes_drawn"] == 1 and result["mask"] is None
    # the box [10, 30) x [10, 30): its edges are image pixels 10 and 29, sheet pixels 11 and 30
    for x, y in ((11, 20), (30, 20), (20, 11), (20, 30), (11, 11), (30, 30)):
        assert tuple(sheet[y, x]) == BOX_COLOUR, (x, y)
    for x, y in ((20, 20), (10, 20), (31, 20), (20, 31), (5, 5)):
        assert tuple(sheet[y, x]) == (GREY,) * 3, (x, y)


@pytest.mark.parametrize("box_format, normalized, box", [
    ("xywh", False, [[10, 10, 20, 20]]), ("cxcywh", False, [[20, 20, 20, 20]]),
    ("xyxy", True, [[0.25, 0.25, 0.75, 0.75]]), ("cxcywh", True, [[0.5, 0.5, 0.5, 0.5]])])
def test_box_formats_land_on_the_same_pixels(drawn: Path, tmp_path: Path, box_format: str, normalized: bool,
                                             box: list[list[float]]) -> None:
    copy = Path(shutil.copytree(drawn, tmp_path / "ds"))

    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_bbox"][:16] = np.asarray(box, "<f4").view(np.uint8).ravel()

    rewrite_index(copy, change)
    sheet, _ = _sheet(copy, mask=None, box_format=box_format, box_normalized=normalized)
    reference, _ = _sheet(drawn, mask=None)
    assert np.array_equal(sheet, reference)


def test_masks_are_overlaid_a_colour_per_value(drawn: Path) -> None:
    sheet, result = _sheet(drawn, boxes=None)
    assert result["mask"] == "seg" and result["mask_failed"] == [] and result["boxes"] is None
    expected = _tinted(tuple(mask_colours()[1]))
    # mask value 1 covers image columns 0..19 (the 20-pixel mask's columns 0..9, scaled 2x, nearest)
    for x, y in ((1, 1), (20, 35), (10, 20)):
        assert np.abs(sheet[y, x].astype(float) - expected).max() <= 1.5, (x, y, sheet[y, x], expected)
    for x, y in ((21, 1), (40, 40), (30, 20)):  # value 0: background, left clear
        assert tuple(sheet[y, x]) == (GREY,) * 3, (x, y)
    both, _ = _sheet(drawn)  # the box is drawn over the mask
    assert tuple(both[20, 11]) == BOX_COLOUR and np.abs(both[5, 5].astype(float) - expected).max() <= 1.5


def test_a_damaged_mask_is_left_out_not_fatal(drawn: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(drawn, tmp_path / "ds"))
    with open_index(copy) as index:
        spec = index.field_spec("seg")
        path = copy / spec.shards[0].path
        offset = int(index.index.field_columns[spec.image_column("offset")][0])
    data = bytearray(path.read_bytes())
    data[offset + 30] ^= 0xFF
    path.write_bytes(bytes(data))
    sheet, result = _sheet(copy)
    assert result["mask_failed"] == [0] and result["failed"] == []
    assert tuple(sheet[5, 5]) == (GREY,) * 3 and tuple(sheet[20, 11]) == BOX_COLOUR


def test_overlay_fields_auto_and_named(drawn: Path, built: tuple[list[dict[str, Any]], Path]) -> None:
    with open_index(drawn) as index:
        assert overlay_fields(index) == ("bbox", "seg")  # "other" is [N,4] but not named like boxes
        assert overlay_fields(index, "other", None) == ("other", None)
        with pytest.raises(OptionError, match="not an \\[N,4\\] array"):
            overlay_fields(index, "seg")
        with pytest.raises(OptionError, match="not an image field"):
            overlay_fields(index, mask="bbox")
        with pytest.raises(OptionError, match="no field 'nope'"):
            overlay_fields(index, "nope")
    with open_index(built[1]) as index:
        assert overlay_fields(index) == ("boxes", "mask")


def test_cli_grid_overlays(drawn: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid.png"
    result = _cli("inspect", str(drawn), "--grid", str(out), "--grid-count", "2", "--json")
    assert result.exit_code == 0, result.output
    grid = json.loads(result.stdout)["grid"]
    assert (grid["boxes"], grid["mask"], grid["boxes_drawn"]) == ("bbox", "seg", 1)
    assert "1 box(es) of field 'bbox' outlined; masks of field 'seg' overlaid" in result.stderr
    plain = _cli("inspect", str(drawn), "--grid", str(out), "--force", "--boxes", "none", "--mask", "none", "--json")
    assert json.loads(plain.stdout)["grid"]["boxes"] is None and json.loads(plain.stdout)["grid"]["mask"] is None
    named = _cli("inspect", str(drawn), "--grid", str(out), "--force", "--boxes", "other", "--box-format", "xywh",
                 "--json")
    assert json.loads(named.stdout)["grid"]["boxes"] == "other"
    bad = _cli("inspect", str(drawn), "--grid", str(tmp_path / "x.png"), "--boxes", "seg")
    assert bad.exit_code == 2 and "not an [N,4] array" in bad.output
    lonely = _cli("inspect", str(drawn), "--boxes", "bbox")
    assert lonely.exit_code == 2 and "need --grid" in lonely.output


def test_the_contact_sheet_refuses_an_unknown_box_format(built: tuple[list[dict[str, Any]], Path],
                                                         tmp_path: Path) -> None:
    from packer.errors import OptionError
    from packer.inspect.grid import contact_sheet

    _, folder = built
    with open_dataset(folder) as ds, pytest.raises(OptionError) as caught:
        contact_sheet(ds, tmp_path / "sheet.png", count=2, box_format="yolo")
    assert caught.value.message == "box format must be one of xyxy, xywh, cxcywh, got 'yolo'"
    assert not (tmp_path / "sheet.png").exists()


def test_a_contact_sheet_that_cannot_be_written_is_a_packer_error(built: tuple[list[dict[str, Any]], Path],
                                                                  tmp_path: Path) -> None:
    from packer.errors import PackerError
    from packer.inspect.grid import contact_sheet

    _, folder = built
    target = tmp_path / "no" / "such" / "sheet.png"
    with open_dataset(folder) as ds, pytest.raises(PackerError) as caught:
        contact_sheet(ds, target, count=2)
    assert caught.value.message.startswith("cannot write the contact sheet: ")
    assert not target.parent.exists()
