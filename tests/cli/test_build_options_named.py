"""``packer build`` names every option as the user typed it: the command builds its two values
(``BuildSettings``, ``RunOptions``) once and hands them down, so no option is renamed on the way
(``--classes-from`` used to be reported as ``--classes``, a resume mismatch as ``shard_size``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import write_images
from packer import format as fmt
from packer.cli import _register, cli

_register()


def _build(*argv: object, json_out: bool = True) -> tuple[int, dict | None, str]:
    args = ["build", *(str(a) for a in argv), "-q", "--workers", "1"] + (["--json"] if json_out else [])
    done = CliRunner().invoke(cli, args)
    return done.exit_code, json.loads(done.stdout) if json_out else None, done.stderr


@pytest.fixture
def splits(tmp_path: Path) -> dict[str, Path]:
    write_images(tmp_path / "train", {"cat": 2, "dog": 2})
    write_images(tmp_path / "val", {"cat": 1, "dog": 1, "emu": 1}, seed=3)
    assert _build(tmp_path / "train", tmp_path / "train-ds")[0] == 0
    return {"train": tmp_path / "train", "val": tmp_path / "val", "train-ds": tmp_path / "train-ds"}


def _report(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text("utf-8").splitlines()]


def test_a_class_outside_the_list_from_classes_from_is_reported_under_that_option(splits, tmp_path) -> None:
    out = tmp_path / "val-ds"
    code, document, errors = _build(splits["val"], out, "--classes-from", splits["train-ds"], json_out=False)
    assert code == 0, errors
    assert "labels: 2 classes from the given class list (--classes-from)" in errors
    rejected = [line for line in _report(out) if line["type"] == "rejected"]
    assert [(r["key"], r["reason"], r["message"]) for r in rejected] == [
        ("emu/000.jpg", "unknown-class",
         f"class 'emu' is not in the class list (--classes-from {splits['train-ds']})")]
    with open(out / fmt.MANIFEST_NAME, encoding="utf-8") as handle:
        labels = json.load(handle)["build"]["settings"]["labels"]
    assert labels["classes"] == ["cat", "dog"] and labels["classes_origin"] == f"--classes-from {splits['train-ds']}"
    code, document, errors = _build(splits["val"], tmp_path / "val-2", "--classes", "cat,dog")
    assert code == 0, errors
    assert [r["message"] for r in _report(tmp_path / "val-2") if r["type"] == "rejected"] == [
        "class 'emu' is not in the class list (--classes)"]


def test_classes_from_on_a_source_without_main_labels_is_refused_under_that_option(splits, tmp_path) -> None:
    images = tmp_path / "coco-images"
    write_images(images, {"a": 1})
    (tmp_path / "instances.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a/000.jpg"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 2, 2]}],
        "categories": [{"id": 1, "name": "a"}]}))
    code, document, errors = _build(tmp_path / "instances.json", tmp_path / "coco-ds", "--root", images,
                                    "--classes-from", splits["train-ds"])
    assert code == 2 and document["error"] == "OptionError", errors
    assert document["message"] == (f"--classes-from {splits['train-ds']} does not apply to a COCO source: its "
                                   f"samples have no main label (-1); the objects' categories are the 'labels' field")
    code, document, errors = _build(tmp_path / "instances.json", tmp_path / "coco-ds", "--root", images,
                                    "--classes", "a,b")
    assert code == 2 and document["message"].startswith("--classes does not apply to a COCO source"), errors


@pytest.mark.parametrize("first, then, named", [
    (["--classes-from", "{train-ds}"], ["--classes", "cat,dog,emu"],
     "--classes: built 2 names ['cat', 'dog'], asked 3 names ['cat', 'dog', 'emu']"),
    (["--classes", "cat,dog,emu"], ["--classes-from", "{train-ds}"],
     "--classes-from: built 3 names ['cat', 'dog', 'emu'], asked 2 names ['cat', 'dog']"),
    ([], ["--no-shuffle"], "--no-shuffle: built not given, asked given"),
    ([], ["--normalize-formats"], "--normalize-formats: built not given, asked given"),
    ([], ["--shard-size", "64K"], "--shard-size: built 536870912, asked 65536"),
    ([], ["--max-file-size", "1M"], "--max-file-size: built 1073741824, asked 1048576"),
    ([], ["--label-field", "kind"], "--label-field: built 'label', asked 'kind'"),
    ([], ["--label-type", "str"], "--label-type: built 'auto', asked 'str'"),
    ([], ["--codec", "jpeg", "--quality", "80"], "--codec: built 'passthrough', asked 'jpeg:quality=80'"),
    ([], ["--field", "score=float32@json"],
     "--field: built [], asked [{'name': 'score', 'kind': 'array', 'dtype': 'float32', 'shape': [], "
     "'source': 'json'}]"),
    ([], ["--validate", "full", "--max-pixels", "99999"],
     "--validate: built 'header', asked 'full'; --max-pixels: built 150000000, asked 99999"),
])
def test_resume_of_a_finished_dataset_names_each_option_that_differs(splits, tmp_path, first, then, named) -> None:
    first = [a.format(**{k: str(v) for k, v in splits.items()}) for a in first]
    then = [a.format(**{k: str(v) for k, v in splits.items()}) for a in then]
    out = tmp_path / "ds"
    assert _build(splits["train"], out, *first)[0] == 0
    code, document, errors = _build(splits["train"], out, "--resume", *then)
    assert code == 3 and document["error"] == "BuildError", errors
    assert document["message"] == (f"{out}: --resume: a finished dataset is here, built with other options "
                                   f"({named}); pass --overwrite to rebuild it, or use the options it was built with")
    code, document, errors = _build(splits["train"], out, "--resume", *first)
    assert code == 0 and document["already_complete"], errors  # the same options: nothing to do


def test_a_split_build_names_the_option_that_differs_from_its_plan(splits, tmp_path) -> None:
    out = tmp_path / "split"
    assert _build(splits["train"], out, "--plan-only", "--label-field", "cls")[0] == 0
    code, document, errors = _build(splits["train"], out, "--part", "0/2")
    assert code == 2, errors
    assert "(--part reuses its saved plan): --label-field: saved 'cls', asked 'label'; give every" in document["message"]
    code, document, errors = _build(splits["val"], out, "--part", "0/2", "--label-field", "cls", "--source-kind", "zip")
    assert code == 2 and document["message"].endswith("val: --source-kind zip: the source is not a readable zip "
                                                      "archive"), errors


def test_a_rejected_file_is_reported_where_the_report_is(splits, tmp_path) -> None:
    (splits["train"] / "dog" / "broken.jpg").write_bytes(b"not an image")
    out = tmp_path / "ds"
    code, document, errors = _build(splits["train"], out, json_out=False)
    assert code == 0, errors
    assert f"rejected 1 file(s): 1 not-an-image; see {out / fmt.REPORT_NAME}" in errors
