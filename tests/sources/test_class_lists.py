"""One class list across splits (--classes, --classes-from, check_classes) and strict manifest labels."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer import format as fmt
from packer.writer import build
from packer.sources import SourceOptions, list_source
from packer.classes import check_classes, load_class_list
from packer.cli import cli, _register
from packer.dataset import open_index
from packer.errors import ClassListMismatchError, EmptySourceError, OptionError, SourceError
from packer import LabelSettings, SourceSettings
from packer import BuildSettings, RunOptions
from packer import LayoutSettings

_register()


def write_images(root: Path, classes: dict[str, int], *, size: int = 16) -> None:
    rng = np.random.default_rng(0)
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(
                root / name / f"{i:03d}.jpg", quality=80)


def labels_by_class(path: Path) -> dict[str, set[int]]:
    """{folder name of the key: the labels its samples got}."""
    with open_index(path) as index:
        out: dict[str, set[int]] = {}
        for i in range(len(index)):
            out.setdefault(index.key(i).split("/")[0], set()).add(int(index.labels[i]))
        return out


def quick(source: Path, out: Path, *, classes: object = None, shuffle: bool = True) -> object:
    return build(source, out, BuildSettings(layout=LayoutSettings(shuffle=shuffle), labels=LabelSettings(classes=classes)),
                 RunOptions(workers=1))


# --- folder sources ---------------------------------------------------------------------------

def test_val_missing_a_class_keeps_train_labels_with_classes_from(tmp_path: Path) -> None:
    write_images(tmp_path / "train", {"cat": 2, "dog": 2, "emu": 2})
    write_images(tmp_path / "val", {"dog": 2, "emu": 2, "wolf": 1})  # no cat, an extra wolf
    quick(tmp_path / "train", tmp_path / "train-ds")
    # Without a class list, val numbers its own folders: dog is 0 in val but 1 in train (the trap).
    quick(tmp_path / "val", tmp_path / "val-naive")
    assert labels_by_class(tmp_path / "val-naive")["dog"] == {0}
    with pytest.raises(ClassListMismatchError, match="lacks \\['cat'\\].*extra \\['wolf'\\]"):
        check_classes(tmp_path / "train-ds", tmp_path / "val-naive")

    train_classes = open_index(tmp_path / "train-ds").classes
    result = quick(tmp_path / "val", tmp_path / "val-ds", classes=train_classes)
    assert open_index(tmp_path / "val-ds").classes == ("cat", "dog", "emu")  # cat kept, 0 samples
    assert labels_by_class(tmp_path / "val-ds") == {"dog": {1}, "emu": {2}}
    assert sorted((r.key, r.reason) for r in result.rejected) == [("wolf/000.jpg", "unknown-class")]
    assert check_classes(tmp_path / "train-ds", tmp_path / "val-ds") == train_classes
    manifest = open_index(tmp_path / "val-ds").manifest
    assert manifest.build["classes_checksum"] == fmt.class_list_checksum(train_classes)
    assert manifest.build["classes_checksum"] == open_index(tmp_path / "train-ds").classes_checksum
    report = (tmp_path / "val-ds" / "build-report.jsonl").read_text()
    assert '"reason": "unknown-class"' in report and "wolf/000.jpg" in report


def test_append_keeps_a_fixed_class_list(tmp_path: Path) -> None:
    from packer.writer.append import append

    write_images(tmp_path / "train", {"cat": 1, "dog": 1})
    write_images(tmp_path / "more", {"dog": 2, "wolf": 1})
    (tmp_path / "more" / "dog" / "000.jpg").unlink()  # already in the dataset under that key
    quick(tmp_path / "train", tmp_path / "ds", classes=("cat", "dog", "emu"))
    result = append(tmp_path / "ds", tmp_path / "more", run=RunOptions(workers=1))
    assert open_index(tmp_path / "ds").classes == ("cat", "dog", "emu")
    assert [(r.key, r.reason) for r in result.rejected] == [("wolf/000.jpg", "unknown-class")]
    assert sorted(open_index(tmp_path / "ds").labels.tolist()) == [0, 1, 1]


def test_on_error_fail_refuses_unknown_classes_as_a_whole(tmp_path: Path) -> None:
    write_images(tmp_path / "val", {"dog": 1, "wolf": 1})
    with pytest.raises(SourceError, match="not in the class list.*wolf/000.jpg"):
        build(tmp_path / "val", tmp_path / "out", BuildSettings(labels=LabelSettings(classes=("cat", "dog"))), RunOptions(workers=1, on_error="fail"))
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


def test_cli_classes_list_file_and_classes_from(tmp_path: Path) -> None:
    write_images(tmp_path / "train", {"a": 1, "b": 1, "c": 1})
    write_images(tmp_path / "val", {"c": 1, "a": 1})
    runner = CliRunner()
    result = runner.invoke(cli, ["build", str(tmp_path / "train"), str(tmp_path / "t"), "-q"])
    assert result.exit_code == 0, result.output
    assert "3 classes from folder names" in result.output
    result = runner.invoke(cli, ["build", str(tmp_path / "val"), str(tmp_path / "v"), "-q",
                                 "--classes-from", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    assert open_index(tmp_path / "v").classes == ("a", "b", "c")
    assert labels_by_class(tmp_path / "v") == {"a": {0}, "c": {2}}
    (tmp_path / "classes.txt").write_text("c\n b \n\na\n")
    result = runner.invoke(cli, ["build", str(tmp_path / "val"), str(tmp_path / "f"), "-q", "--classes",
                                 str(tmp_path / "classes.txt")])
    assert result.exit_code == 0, result.output
    assert open_index(tmp_path / "f").classes == ("c", "b", "a")
    result = runner.invoke(cli, ["build", str(tmp_path / "val"), str(tmp_path / "g"), "-q", "--classes", "a,a"])
    assert result.exit_code == 2 and "listed twice" in result.output
    checksum = fmt.class_list_checksum(("a", "b", "c"))
    for out in ("t", "v"):  # inspect shows the same checksum for both splits
        shown = runner.invoke(cli, ["inspect", str(tmp_path / out)]).output
        assert f"class-list checksum {checksum}" in shown


def test_cli_summary_states_the_label_rule(tmp_path: Path) -> None:
    write_images(tmp_path / "img", {"x": 2})
    (tmp_path / "ints.csv").write_text("path,label\nx/000.jpg,4\nx/001.jpg,9\n")
    runner = CliRunner()
    auto = runner.invoke(cli, ["build", str(tmp_path / "ints.csv"), str(tmp_path / "a"), "-q",
                               "--root", str(tmp_path / "img")])
    assert auto.exit_code == 0 and "integers as written in the manifest (auto: every label is a plain integer)" \
        in auto.output
    as_str = runner.invoke(cli, ["build", str(tmp_path / "ints.csv"), str(tmp_path / "s"), "-q",
                                 "--root", str(tmp_path / "img"), "--label-type", "str", "--json"])
    assert as_str.exit_code == 0 and "2 classes from label strings" in as_str.stderr
    document = json.loads(as_str.stdout)
    assert document["label_type"] == "str" and document["classes"] == 2
    assert open_index(tmp_path / "s").classes == ("4", "9")


def test_build_options_take_the_cli_spellings_of_a_class_list(tmp_path: Path) -> None:
    (tmp_path / "classes.json").write_text('["b", "a"]')
    assert LabelSettings(classes=str(tmp_path / "classes.json")).classes == ("b", "a")
    assert LabelSettings(classes="x, y").classes == ("x", "y")
    assert LabelSettings(classes=["p", "q"]).classes == ("p", "q")


@pytest.mark.parametrize("spec, message", [("", "empty"), ("a,,a", "twice"), ("missing/list.txt", "no such file")])
def test_bad_class_lists_are_option_errors(spec: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        load_class_list(spec)


@pytest.mark.parametrize("content, message", [("[" * 100_000, "nests arrays or objects deeper than 64"),
                                              ("[1, ", "not JSON"), ('{"a": 1}', "JSON list"),
                                              ('["a", 3]', "non-empty strings"), ("[]", "empty")])
def test_bad_class_list_files_are_option_errors(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "classes.json").write_text(content)
    with pytest.raises(OptionError, match=message):
        load_class_list(tmp_path / "classes.json")


def test_building_the_parent_of_splits_warns_loudly(tmp_path: Path, caplog) -> None:
    write_images(tmp_path / "data" / "train", {"cat": 1})
    write_images(tmp_path / "data" / "val", {"cat": 1})
    with caplog.at_level(logging.WARNING, logger="packer"):
        result = quick(tmp_path / "data", tmp_path / "out")
    assert any("look like dataset splits" in r.message for r in caplog.records)
    assert "look like dataset splits" in result.summary["warnings"][0]
    runner = CliRunner()
    cli_result = runner.invoke(cli, ["build", str(tmp_path / "data"), str(tmp_path / "out2"), "-q"])
    assert cli_result.exit_code == 0 and "WARNING" in cli_result.output and "--classes-from" in cli_result.output


def test_ordinary_class_named_test_does_not_warn(tmp_path: Path, caplog) -> None:
    write_images(tmp_path / "data", {"test": 1, "cat": 1, "dog": 1})
    with caplog.at_level(logging.WARNING, logger="packer"):
        result = quick(tmp_path / "data", tmp_path / "out")
    assert "warnings" not in result.summary and not caplog.records


def test_torchvision_names_and_classes_check_on_open(tmp_path: Path) -> None:
    torch_mod = pytest.importorskip("packer.torch")
    write_images(tmp_path / "train", {"cat": 2, "dog": 1})
    write_images(tmp_path / "val", {"dog": 1})
    quick(tmp_path / "train", tmp_path / "t", shuffle=False)
    quick(tmp_path / "val", tmp_path / "v")
    train = torch_mod.PackedDataset(tmp_path / "t")
    assert train.class_to_idx == {"cat": 0, "dog": 1}
    assert list(train.targets) == [0, 0, 1] and not train.targets.flags.writeable
    assert np.shares_memory(train.targets, train.dataset.index.label)  # zero-copy
    with pytest.raises(ValueError):
        train.targets[0] = 5
    with pytest.raises(ClassListMismatchError, match="lacks \\['cat'\\]"):
        torch_mod.PackedDataset(tmp_path / "v", classes=train.classes)
    with pytest.raises(ClassListMismatchError):
        torch_mod.check_classes(train, torch_mod.PackedDataset(tmp_path / "v"))


def test_reordered_classes_are_a_mismatch() -> None:
    with pytest.raises(ClassListMismatchError, match="'a' is 0 in .* but 1"):
        check_classes(["a", "b"], ["b", "a"])


# --- manifest labels ----------------------------------------------------------------------------

def make_manifest(tmp_path: Path, rows: list[tuple[str, str]], header: str = "path,label") -> Path:
    write_images(tmp_path / "img", {"x": len(rows)})
    path = tmp_path / "list.csv"
    path.write_text(header + "\n" + "".join(f"x/{i:03d}.jpg,{label}\n" for i, (_, label) in enumerate(rows)))
    return path


def test_string_labels_are_sorted_class_names_and_label_type_is_reported(tmp_path: Path) -> None:
    manifest = make_manifest(tmp_path, [("", "zebra"), ("", "ant"), ("", "zebra")])
    listing = list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img")))
    assert listing.classes == ("ant", "zebra") and listing.labels.tolist() == [1, 0, 1]
    assert listing.label_type == "str"
    result = build(manifest, tmp_path / "ds", BuildSettings(source=SourceSettings(root=tmp_path / "img")), RunOptions(workers=1))
    assert result.summary["label_type"] == "str"


@pytest.mark.parametrize("label", ['" 1 "', "1_000", "\u0661", "+1", "007"])
def test_labels_that_only_look_like_integers_are_rejected_not_read(tmp_path: Path, label: str) -> None:
    manifest = make_manifest(tmp_path, [("", "1"), ("", label), ("", "2")])
    listing = list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img")))
    assert listing.labels.tolist() == [1, 2] and listing.classes == ()
    [rejection] = listing.rejected  # the contract's rule for every door: bad-label, keyed by the file
    assert (rejection.key, rejection.reason) == ("x/001.jpg", "bad-label") and "strictly" in rejection.message


def test_label_type_int_and_str(tmp_path: Path) -> None:
    manifest = make_manifest(tmp_path, [("", "3"), ("", "cat"), ("", "10")])
    with pytest.raises(SourceError, match="labels mix integers.*--label-type str"):
        list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img")))
    as_int = list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img"), labels=LabelSettings(label_type="int")))
    assert as_int.labels.tolist() == [3, 10] and [r.reason for r in as_int.rejected] == ["bad-label"]
    as_str = list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img"), labels=LabelSettings(label_type="str")))
    assert as_str.classes == ("10", "3", "cat") and as_str.labels.tolist() == [1, 2, 0]
    with pytest.raises(OptionError, match="label-type"):
        list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img"), labels=LabelSettings(label_type="float")))


def test_manifest_with_a_class_list_rejects_unknown_labels(tmp_path: Path) -> None:
    manifest = make_manifest(tmp_path, [("", "dog"), ("", "wolf"), ("", "cat")])
    listing = list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img"), labels=LabelSettings(classes=("cat", "dog", "emu"))))
    assert listing.classes == ("cat", "dog", "emu") and listing.labels.tolist() == [1, 0]
    assert [r.reason for r in listing.rejected] == ["unknown-class"]


def test_duplicate_path_column_is_an_error(tmp_path: Path) -> None:
    write_images(tmp_path / "img", {"x": 2})
    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label,path\nx/000.jpg,1,x/001.jpg\n")
    with pytest.raises(SourceError, match="repeats column.*path"):
        list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img")))


def test_csv_column_named_metadata_is_refused(tmp_path: Path) -> None:
    write_images(tmp_path / "img", {"x": 1})
    manifest = tmp_path / "list.csv"
    manifest.write_text('path,label,metadata\nx/000.jpg,1,"{""a"": 1}"\n')
    with pytest.raises(SourceError, match="named 'metadata'"):
        list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img")))


def test_jsonl_hostile_rows_are_rejected_per_row(tmp_path: Path) -> None:
    write_images(tmp_path / "img", {"x": 7})
    rows = [
        json.dumps({"path": "x/000.jpg", "label": 1, "metadata": {"ok": 1.5}}),
        '{"path": "x/001.jpg", "label": 1, "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"path": "x/002.jpg", "label": 1, "metadata": {"score": NaN}}',
        '{"path": "x/003.jpg", "label": 1, "metadata": {"big": 1e400}}',
        json.dumps({"path": "x/004.jpg", "label": 1, "metadata": ["a", "list"]}),
        json.dumps({"path": "x/005.jpg", "label": 1, "metadata": "a string"}),
        json.dumps({"path": "x/006.jpg", "label": 1, "pad": "y" * (2 << 20)}),
    ]
    manifest = tmp_path / "list.jsonl"
    manifest.write_text("\n".join(rows) + "\n")
    listing = list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img")))
    assert len(listing) == 1 and listing.metadata(0) == b'{"ok":1.5}'
    reasons = {r.key.split(":")[1]: (r.reason, r.message) for r in listing.rejected}
    assert "deeper than" in reasons["2"][1]
    assert "NaN" in reasons["3"][1] and "out of range" in reasons["4"][1]
    assert reasons["5"][0] == reasons["6"][0] == "bad-metadata"
    assert "longer than" in reasons["7"][1]


def test_no_usable_rows_names_reasons_and_header_fixes(tmp_path: Path) -> None:
    write_images(tmp_path / "img", {"x": 3})
    hf = tmp_path / "metadata.jsonl"
    hf.write_text("".join(json.dumps({"file_name": f"x/{i:03d}.jpg", "label": 0}) + "\n" for i in range(3)))
    with pytest.raises(EmptySourceError, match="3 rejected: 3 bad-manifest-row.*rename column 'file_name' to 'path'"):
        list_source(hf, SourceOptions(source=SourceSettings(root=tmp_path / "img")))
    spaced = tmp_path / "spaced.csv"
    spaced.write_text("path, label\nx/000.jpg,1\n")
    with pytest.raises(SourceError, match="' label' has spaces"):
        list_source(spaced, SourceOptions(source=SourceSettings(root=tmp_path / "img")))
    nolabel = tmp_path / "nolabel.csv"
    nolabel.write_text("path,target\nx/000.jpg,1\n")
    with pytest.raises(SourceError, match="rename column 'target' to 'label'"):
        list_source(nolabel, SourceOptions(source=SourceSettings(root=tmp_path / "img")))
    lists = tmp_path / "lists.jsonl"
    lists.write_text("".join(json.dumps({"path": f"x/{i:03d}.jpg", "label": [0, 1]}) + "\n" for i in range(3)))
    with pytest.raises(EmptySourceError, match="is a list \\(multi-label\\)"):
        list_source(lists, SourceOptions(source=SourceSettings(root=tmp_path / "img")))


# --- label kinds crossed with a given class list (issue 31: survivors of the hand-written round) ------

def test_integer_labels_followed_only_by_names_are_refused_as_a_mix(tmp_path: Path) -> None:
    manifest = make_manifest(tmp_path, [("", "3"), ("", "0"), ("", "cat")])
    with pytest.raises(SourceError) as caught:
        list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img")))
    assert caught.value.message.startswith("labels mix integers (first: 3) and class names (first: 'cat'): "
                                           "x/000.jpg and x/002.jpg")


def test_integer_labels_with_a_given_class_list_must_be_below_its_length(tmp_path: Path) -> None:
    manifest = make_manifest(tmp_path, [("", "0"), ("", "2"), ("", "3"), ("", "-1")])
    listing = list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img"), labels=LabelSettings(classes=("a", "b", "c"), label_type="int")))
    assert listing.classes == ("a", "b", "c") and listing.labels.tolist() == [0, 2]
    assert [(r.reason, r.message) for r in listing.rejected] == [
        ("unknown-class", "label 3 is outside the 3 classes given (--classes)"),
        ("unknown-class", "label -1 is outside the 3 classes given (--classes)")]


def test_a_given_class_list_keeps_its_order_for_name_labels(tmp_path: Path) -> None:
    manifest = make_manifest(tmp_path, [("", "cat"), ("", "dog"), ("", "cat")])
    result = build(manifest, tmp_path / "ds", BuildSettings(source=SourceSettings(root=tmp_path / "img"), labels=LabelSettings(classes=("dog", "cat"))), RunOptions(workers=1))
    assert result.classes == ("dog", "cat")
    with open_index(tmp_path / "ds") as index:
        assert index.classes == ("dog", "cat")
        assert {index.key(i): int(index.labels[i]) for i in range(len(index))} == {
            "x/000.jpg": 1, "x/001.jpg": 0, "x/002.jpg": 1}


def test_the_int64_range_is_read_to_its_ends(tmp_path: Path) -> None:
    low, high = -(1 << 63), (1 << 63) - 1
    manifest = make_manifest(tmp_path, [("", str(low)), ("", str(high)), ("", str(low - 1)), ("", str(high + 1))])
    listing = list_source(manifest, SourceOptions(source=SourceSettings(root=tmp_path / "img"), labels=LabelSettings(label_type="int")))
    assert listing.labels.tolist() == [low, high]
    assert [r.message for r in listing.rejected] == [f"label {low - 1} does not fit in a signed 64-bit integer",
                                                     f"label {high + 1} does not fit in a signed 64-bit integer"]
