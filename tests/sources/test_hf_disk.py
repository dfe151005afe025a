"""The Hugging Face ``save_to_disk`` door, against folders written by the real ``datasets``
library: ClassLabel names, image columns as {bytes, path} structs or plain bytes, the other
columns as declared fields, several data files, and a DatasetDict's splits sharing one class list."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

hf = pytest.importorskip("datasets", reason="writing save_to_disk folders needs datasets (the dev extra)")
pytest.importorskip("pyarrow")

import packer  # noqa: E402
from packer import SourceError  # noqa: E402
from packer.classes import check_classes  # noqa: E402
from packer.decode import decode_as_stored  # noqa: E402
from packer.writer import build  # noqa: E402
from packer import BuildSettings, LayoutSettings, RunOptions, SourceSettings  # noqa: E402
from packer import SourceSettings


def _png(seed: int, size: tuple[int, int] = (8, 10), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    shape = size + ((3,) if mode == "RGB" else ())
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode=mode).save(buffer, "PNG")
    return buffer.getvalue()


FEATURES = {
    "image": hf.Image(), "label": hf.ClassLabel(names=["cat", "dog", "owl"]), "caption": hf.Value("string"),
    "score": hf.Value("float32"), "count": hf.Value("int16"), "ok": hf.Value("bool"),
    "pose": hf.Sequence(hf.Value("float32"), length=3),
    "boxes": hf.Sequence(hf.Sequence(hf.Value("float32"), length=4)),
    "tags": hf.Sequence(hf.ClassLabel(names=["indoor", "outdoor", "night"])),
    "weather": hf.ClassLabel(names=["sun", "rain"]), "mask": hf.Image(),
    "meta": {"x": hf.Value("int32")}, "Camera Model": hf.Value("string"),
}


def _rows(count: int, offset: int = 0) -> dict[str, list]:
    n = range(offset, offset + count)
    return {
        "image": [{"bytes": _png(i), "path": f"photos/{i:03d}.png"} for i in n],
        "label": [i % 3 for i in n], "caption": [f"photo {i} ✓" for i in n], "score": [i / 4 for i in n],
        "count": [i - 3 for i in n], "ok": [i % 2 == 0 for i in n], "pose": [[i, -1.5, 0.25] for i in n],
        "boxes": [[[i, 1, i + 2, 5]] * (i % 3) for i in n], "tags": [[2, 0][: i % 3] for i in n],
        "weather": [i % 2 for i in n], "mask": [{"bytes": _png(100 + i, mode="L"), "path": None} for i in n],
        "meta": [{"x": i} for i in n], "Camera Model": ["X100"] * count,
    }


@pytest.fixture(scope="module")
def hf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf")


def _build(source: Path, out: Path, **source_settings) -> Path:
    build(source, out, BuildSettings(source=SourceSettings(**source_settings), layout=LayoutSettings(shard_size=16 << 10)),
          RunOptions(workers=1))
    return out


def test_a_dataset_keeps_its_class_names_images_and_columns_as_fields(hf_root, caplog):
    data = hf.Dataset.from_dict(_rows(10), features=hf.Features(FEATURES))
    data.save_to_disk(str(hf_root / "one"), num_shards=3)  # three Arrow data files, rows in order
    assert len(list((hf_root / "one").glob("*.arrow"))) == 3
    with caplog.at_level(logging.WARNING, logger="packer.build"):
        out = _build(hf_root / "one", hf_root / "one-packed")
    warned = caplog.text
    assert "'meta' is not stored (a struct column)" in warned and "'Camera Model' is not stored" in warned
    ds = packer.open_dataset(out)
    assert ds.classes == ("cat", "dog", "owl") and len(ds) == 10
    assert ds.manifest.build["settings"]["source"]["kind"] == "hf"
    declared = {spec.name: spec for spec in ds.fields}
    assert {name: spec.describe() for name, spec in declared.items()} == {
        "caption": "caption: text", "score": "score: float32", "count": "count: int16", "ok": "ok: bool",
        "pose": "pose: float32[3]", "boxes": "boxes: float32[N,4]", "tags": "tags: classes(3)",
        "weather": "weather: int64", "mask": "mask: image"}
    assert declared["tags"].classes == ("indoor", "outdoor", "night")
    assert declared["weather"].classes == ("sun", "rain")
    saved = hf.load_from_disk(str(hf_root / "one"))  # what datasets itself reads back (paths: base names)
    rows = saved.cast_column("image", hf.Image(decode=False)).cast_column("mask", hf.Image(decode=False))
    for i in range(len(ds)):
        key = ds.key(i)
        row = rows[int(key.split(".")[0])]  # datasets keeps the base name of a path
        assert key == row["image"]["path"]
        assert bytes(ds.get(i)) == row["image"]["bytes"]
        assert ds.labels[i] == row["label"]
        assert ds.field_value("caption", i) == row["caption"]
        assert ds.field_value("score", i) == np.float32(row["score"])
        assert ds.field_value("count", i) == row["count"] and bool(ds.field_value("ok", i)) == row["ok"]
        assert ds.field_value("pose", i).tolist() == row["pose"]
        assert ds.field_value("boxes", i).reshape(-1, 4).tolist() == row["boxes"]
        assert ds.field_value("tags", i).tolist() == sorted(row["tags"])
        assert ds.field_value("weather", i) == row["weather"]
        assert bytes(ds.field_bytes("mask", i)) == row["mask"]["bytes"]
        assert np.array_equal(ds.field_image("mask", i), decode_as_stored(row["mask"]["bytes"]))
    assert packer.verify_dataset(out).ok


def test_a_dataset_dict_gives_its_splits_one_class_list(hf_root):
    features = hf.Features({"image": hf.Image(), "label": hf.Value("string")})
    train = hf.Dataset.from_dict({"image": [_png(i) for i in range(6)],
                                  "label": ["wolf", "ant", "wolf", "ant", "ant", "wolf"]}, features=features)
    test = hf.Dataset.from_dict({"image": [_png(50 + i) for i in range(3)], "label": ["zebra", "ant", None]},
                                features=features)
    hf.DatasetDict({"train": train, "test": test}).save_to_disk(str(hf_root / "dict"))
    with pytest.raises(SourceError, match="a DatasetDict with splits train, test: build each split") as caught:
        _build(hf_root / "dict", hf_root / "dict-packed")
    assert f"packer build {hf_root / 'dict' / 'train'} OUT-train" in str(caught.value)
    packed_train = packer.open_dataset(_build(hf_root / "dict" / "train", hf_root / "dict-train"))
    packed_test = packer.open_dataset(_build(hf_root / "dict" / "test", hf_root / "dict-test"))
    # train alone has no zebra, test no wolf: both number the names of every split
    assert packed_train.classes == packed_test.classes == ("ant", "wolf", "zebra")
    check_classes(packed_train, packed_test)
    assert sorted(packed_test.labels.tolist()) == [0, 2]
    report = (hf_root / "dict-test" / "build-report.jsonl").read_text()
    assert '"unlabeled"' in report and "has no label" in report  # a dataset with classes: R40, the contract's rule
    assert sorted(packed_train.key(i) for i in range(6)) == [f"{i:09d}" for i in range(6)]  # no path: row numbers


def test_class_label_splits_must_share_names_and_keep_minus_one(hf_root):
    image = hf.Image()
    train = hf.Dataset.from_dict({"image": [_png(i) for i in range(3)], "label": [0, 1, 1]},
                                 features=hf.Features({"image": image, "label": hf.ClassLabel(names=["a", "b"])}))
    test = hf.Dataset.from_dict({"image": [_png(9)], "label": [-1]},
                                features=hf.Features({"image": image, "label": hf.ClassLabel(names=["a", "b"])}))
    other = hf.Dataset.from_dict({"image": [_png(8)], "label": [0]},
                                 features=hf.Features({"image": image, "label": hf.ClassLabel(names=["b", "a"])}))
    hf.DatasetDict({"train": train, "test": test, "extra": other}).save_to_disk(str(hf_root / "cl"))
    with pytest.raises(SourceError, match="split 'extra' names the classes of 'label' \\['b', 'a'\\]"):
        _build(hf_root / "cl" / "train", hf_root / "cl-train")
    hf.DatasetDict({"train": train, "test": test}).save_to_disk(str(hf_root / "cl2"))
    with pytest.raises(SourceError, match="unlabeled"):  # the test split's only row has no label
        _build(hf_root / "cl2" / "test", hf_root / "cl2-test")
    packed = packer.open_dataset(_build(hf_root / "cl2" / "test", hf_root / "cl2-test-unlabeled", label_field=""))
    assert packed.classes == () and packed.labels.tolist() == [-1]
    packed = packer.open_dataset(_build(hf_root / "cl2" / "train", hf_root / "cl2-train"))
    assert packed.classes == ("a", "b") and sorted(packed.labels.tolist()) == [0, 1, 1]


def test_a_binary_image_column_and_rejected_rows(hf_root):
    features = hf.Features({"jpeg": hf.Value("binary"), "label": hf.Value("int64"),
                            "depth": hf.Sequence(hf.Value("float32"), length=2)})
    data = hf.Dataset.from_dict({"jpeg": [_png(1), None, _png(3), _png(4)], "label": [3, 1, 2, 7],
                                 "depth": [[1, 2], [3, 4], None, [7, 8]]}, features=features)
    data.save_to_disk(str(hf_root / "bin"))
    with pytest.raises(SourceError, match="no Image column"):
        _build(hf_root / "bin", hf_root / "bin-packed")
    out = _build(hf_root / "bin", hf_root / "bin-packed", image_column="jpeg")
    ds = packer.open_dataset(out)
    assert sorted(ds.key(i) for i in range(len(ds))) == ["000000000", "000000003"]
    assert sorted(ds.labels.tolist()) == [3, 7] and ds.classes == ()  # integer labels as written
    report = (out / "build-report.jsonl").read_text()
    assert '"not-an-image"' in report and '"bad-field"' in report and "'depth' is null" in report


def test_damaged_or_foreign_folders_are_source_errors(hf_root, tmp_path):
    data = hf.Dataset.from_dict({"image": [_png(0)]}, features=hf.Features({"image": hf.Image()}))
    data.save_to_disk(str(tmp_path / "d"))
    (tmp_path / "d" / "state.json").write_text('{"_data_files": [{"filename": "../../etc/passwd"}]}')
    with pytest.raises(SourceError, match="a plain file name in the folder"):
        _build(tmp_path / "d", tmp_path / "d-packed")
    data.save_to_disk(str(tmp_path / "e"))
    arrow = next((tmp_path / "e").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:100])
    with pytest.raises(SourceError, match="damaged or not Arrow"):
        _build(tmp_path / "e", tmp_path / "e-packed")


def _saved(folder: Path, **columns) -> Path:
    features = hf.Features({"image": hf.Image(), **{name: hf.Image() for name in columns}})
    rows = {"image": [_png(0)], **{name: [_png(i + 1, mode="L")] for i, name in enumerate(columns)}}
    hf.Dataset.from_dict(rows, features=features).save_to_disk(str(folder))
    return folder


def test_every_part_of_a_save_to_disk_folder_is_checked_before_it_is_trusted(tmp_path, monkeypatch):
    import json

    from packer import MissingDependencyError
    from packer.sources import SourceOptions, list_source

    def refused(source: Path, **options) -> SourceError:
        with pytest.raises(SourceError) as caught:
            _build(source, tmp_path / "out", **options)
        assert not (tmp_path / "out" / "manifest.json").exists()
        return caught.value

    # a DatasetDict whose split list is not one, or names a split that is not there
    root = tmp_path / "dict"
    _saved(root / "train")
    (root / "dataset_dict.json").write_text('{"splits": []}')
    error = refused(root)
    assert error.message == 'dataset_dict.json must hold {"splits": [names]}, got {\'splits\': []}'
    assert error.path == str(root / "dataset_dict.json")
    (root / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    error = refused(root)
    assert error.message == "split 'test' is not a dataset folder (state.json and dataset_info.json) inside the DatasetDict"
    # state.json without data files, or naming one that is gone
    folder = _saved(tmp_path / "d")
    state = json.loads((folder / "state.json").read_text())
    (folder / "state.json").write_text(json.dumps({**state, "_data_files": []}))
    assert refused(folder).message == "state.json lists no _data_files"
    (folder / "state.json").write_text(json.dumps({**state, "_data_files": [{"filename": "gone.arrow"}]}))
    error = refused(folder)
    assert error.message == "state.json lists 'gone.arrow', which is not in the folder" and error.path == str(folder)
    (folder / "state.json").write_text(json.dumps(state))
    # dataset_info.json without features; an image column that does not exist
    info = (folder / "dataset_info.json").read_text()
    (folder / "dataset_info.json").write_text("{}")
    assert refused(folder).message == "dataset_info.json holds no features"
    (folder / "dataset_info.json").write_text(info)
    assert refused(folder, image_column="photo").message == "--image-column 'photo': no such column (columns: image)"
    # more image columns than one index holds (each takes 7 index columns)
    wide = _saved(tmp_path / "wide", **{f"mask{i}": None for i in range(8)})
    message = refused(wide).message
    assert message.startswith("the columns do not fit one index: these fields need 56 index columns"), message
    # listed without a spool folder (only packer build gives one)
    with pytest.raises(SourceError) as caught:
        list_source(folder, SourceOptions(source=SourceSettings(kind="hf")))
    assert caught.value.message == "a Hugging Face source needs a spool folder (build it through packer build)"
    # and without pyarrow at all
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    with pytest.raises(MissingDependencyError, match=r"needs pyarrow: pip install 'packer-shards\[hf\]'"):
        _build(folder, tmp_path / "no-pyarrow")


def test_the_build_summary_says_how_the_class_names_were_numbered(tmp_path):
    """A ClassLabel keeps its own order and its splits need no --classes-from (the guide says so);
    string labels are numbered across the DatasetDict's splits; a lone split's strings are sorted."""
    from click.testing import CliRunner

    import packer.cli.build_cmd  # noqa: F401  (registers the command)
    from packer.cli import cli

    image = hf.Image()

    def split(labels, feature):
        return hf.Dataset.from_dict({"image": [{"bytes": _png(i), "path": f"{i}.png"} for i in range(len(labels))],
                                     "label": labels}, features=hf.Features({"image": image, "label": feature}))

    names = hf.ClassLabel(names=["zebra", "cat", "owl"])  # not sorted: kept in this order
    hf.DatasetDict({"train": split([0, 1, 2, 0], names), "val": split([2], names)}).save_to_disk(str(tmp_path / "named"))
    strings = hf.Value("string")
    hf.DatasetDict({"train": split(["b", "a"], strings), "val": split(["c"], strings)}).save_to_disk(
        str(tmp_path / "strings"))
    split(["b", "a"], strings).save_to_disk(str(tmp_path / "lone"))

    def summary(source: str) -> str:
        done = CliRunner().invoke(cli, ["build", str(tmp_path / source), str(tmp_path / f"out-{source.replace('/', '-')}"),
                                        "--quiet", "--workers", "1"])
        assert done.exit_code == 0, done.output
        return next(line for line in done.output.splitlines() if line.startswith("labels:"))

    line = summary("named/train")
    assert "3 classes from the source's ClassLabel names, in their order" in line, line
    assert "need no --classes-from" in line and "sorted" not in line and "build other splits" not in line
    assert packer.open_dataset(tmp_path / "out-named-train").classes == ("zebra", "cat", "owl")
    line = summary("strings/train")
    assert "3 classes from the label strings of every split of the DatasetDict, sorted" in line, line
    assert "need no --classes-from" in line
    line = summary("lone")
    assert "2 classes from label strings, sorted" in line and "build other splits with --classes-from" in line
