"""Views (issue 36 item 2): a subset of a dataset as a small file that every reader opens like a
dataset. Each selector, the stable split, append, damage, verify, export, the readers, the CLI."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import run_main, write_images

import packer
from packer import errors
from packer.viewfile import HEADER, parse_view
from packer.views import split_paths


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("views")
    write_images(root / "src", {"cat": 6, "dog": 8, "emu": 4}, size=20)
    packer.build_dataset(root / "src", root / "ds")
    return root / "ds"


def _samples(ds) -> list[tuple[str, int, bytes]]:
    return [(ds.key(i), int(ds.labels[i]), bytes(ds.get(i))) for i in range(len(ds))]


def test_a_view_reads_exactly_the_selected_samples_of_its_dataset(base, tmp_path):
    (path,) = packer.view(base, tmp_path / "cats.pkview", classes="cat,emu")
    with packer.open_dataset(base) as ds, packer.open_dataset(path) as view:
        want = [s for s in _samples(ds) if s[1] in (0, 2)]
        assert _samples(view) == want and len(view) == 10 and view.is_view
        assert view.classes == ds.classes and view.base_rows.tolist() == [i for i in range(len(ds)) if ds.labels[i] != 1]
        batch = view.read_batch([3, 0, 9, 3])
        assert [bytes(batch[j]) for j in range(4)] == [want[3][2], want[0][2], want[9][2], want[3][2]]
        assert [bytes(b) for b, _ in view.iter_samples()] == [s[2] for s in want]
        assert view.find(want[4][0]) == 4 and view.sample_info(4)["base_index"] == int(view.base_rows[4])
        with pytest.raises(errors.SampleIndexError, match="sample 10 out of range for a dataset of 10 samples"):
            view.get(10)
        clone = pickle.loads(pickle.dumps(view))  # what a DataLoader worker gets under spawn
        assert _samples(clone) == want


def test_keys_file_and_where_select_and_combine(base, tmp_path):
    with packer.open_dataset(base) as ds:
        keys = [ds.key(i) for i in (1, 5, 7)]
        widths = ds.index.width.copy()
    (tmp_path / "keys.txt").write_text("\n".join(keys) + "\n")
    (path,) = packer.view(base, tmp_path / "k.pkview", keys=tmp_path / "keys.txt")
    with packer.open_dataset(path) as view:
        assert sorted(view.keys()) == sorted(keys)
    (path,) = packer.view(base, tmp_path / "w.pkview", where=["class == dog", "width >= 20"])
    with packer.open_dataset(path) as view, packer.open_dataset(base) as ds:
        assert len(view) == int(((ds.labels == 1) & (widths >= 20)).sum()) > 0
        assert set(view.labels.tolist()) == {1}
        assert parse_view(path.read_bytes()).selectors == ({"where": "class == dog"}, {"where": "width >= 20"})
    (tmp_path / "missing.txt").write_text("cat/000.jpg\nno/such.png\n")
    with pytest.raises(errors.OptionError, match=r"--keys: 1 of the 2 keys in .* are not in this dataset .*'no/such.png'"):
        packer.view(base, tmp_path / "x.pkview", keys=tmp_path / "missing.txt")


@pytest.mark.parametrize("where, message", [
    ("width ~ 3", "--where takes 'FIELD OP VALUE'"),
    ("colour == red", "--where: no field 'colour'"),
    ("class < dog", "--where: class is text: compare it with == or !="),
    ("width >= wide", "--where: width is a number, got 'wide'"),
])
def test_a_bad_where_is_refused_by_name(base, tmp_path, where, message):
    with pytest.raises(errors.OptionError, match=message.replace("(", r"\(")):
        packer.view(base, tmp_path / "x.pkview", where=where)
    assert not (tmp_path / "x.pkview").exists()


@pytest.mark.parametrize("classes, message", [("cat,wolf", "--classes: 'wolf' is not a class of this dataset"),
                                              ("", "--classes: give at least one class")])
def test_an_unknown_class_is_refused(base, tmp_path, classes, message):
    with pytest.raises(errors.OptionError, match=message):
        packer.view(base, tmp_path / "x.pkview", classes=classes)


@pytest.mark.parametrize("split, message", [("0.9", "2 to 100 fractions"), ("0.5:0.4", "must sum to 1"),
                                            ("a:b", "fractions separated by ':'"), ("1:0", "2 to 100 fractions")])
def test_a_bad_split_is_refused(base, tmp_path, split, message):
    with pytest.raises(errors.OptionError, match=message):
        packer.view(base, tmp_path / "x", split=split)


def test_the_split_is_stable_disjoint_and_complete_and_survives_append(base, tmp_path):
    data = shutil.copytree(base, tmp_path / "ds")
    parts = packer.view(data, tmp_path / "cut" / "part.pkview", split="0.7:0.3", seed=5)
    assert parts == split_paths(tmp_path / "cut" / "part.pkview", 2) == [
        tmp_path / "cut" / "part-0.pkview", tmp_path / "cut" / "part-1.pkview"]
    keys = [set(packer.open_dataset(p).keys()) for p in parts]
    with packer.open_dataset(data) as ds:
        assert keys[0].isdisjoint(keys[1]) and keys[0] | keys[1] == set(ds.keys()) and len(keys[1]) > 0
    # same seed, same parts; another seed, other parts
    again = packer.view(data, tmp_path / "again", split="0.7:0.3", seed=5)
    assert [p.read_bytes()[HEADER:] != b"" for p in again] and [set(packer.open_dataset(p).keys()) for p in again] == keys
    other = packer.view(data, tmp_path / "other", split="0.7:0.3", seed=6)
    assert [set(packer.open_dataset(p).keys()) for p in other] != keys
    # append: the views stay exact (same samples), and a new split puts every old key where it was
    write_images(tmp_path / "more", {"gnu": 3, "fox": 5}, seed=9, size=20)
    packer.append_dataset(data, tmp_path / "more")
    with packer.open_dataset(parts[0]) as view, packer.open_dataset(data) as ds:
        assert set(view.keys()) == keys[0] and len(ds) == 26 and view.view.base_samples == 18
        assert _samples(view) == [s for s in _samples(ds) if s[0] in keys[0]]
    after = packer.view(data, tmp_path / "after", split="0.7:0.3", seed=5)
    new = [set(packer.open_dataset(p).keys()) for p in after]
    assert keys[0] <= new[0] and keys[1] <= new[1]


def test_a_view_of_a_changed_dataset_is_refused_naming_the_view(base, tmp_path):
    data = shutil.copytree(base, tmp_path / "ds")
    (path,) = packer.view(data, tmp_path / "v.pkview", classes="dog")
    shutil.rmtree(data)
    write_images(tmp_path / "src", {"cat": 6, "dog": 8, "emu": 4}, seed=3, size=20)
    packer.build_dataset(tmp_path / "src", data)  # same keys and count, other bytes
    with pytest.raises(errors.IndexMismatchError) as caught:
        packer.open_dataset(path)
    assert str(caught.value).startswith(f"{path}: view of {data} was made of samples whose keys and checksums hash to")
    shutil.rmtree(data)
    write_images(tmp_path / "few", {"cat": 2}, size=20)
    packer.build_dataset(tmp_path / "few", data)
    with pytest.raises(errors.IndexMismatchError, match="was made of its 18 samples, but the dataset now holds 2"):
        packer.open_index(path)
    shutil.rmtree(data)
    with pytest.raises(errors.NotAPackerFileError, match="dataset folder does not exist"):
        packer.open_dataset(path)


def test_a_damaged_view_file_is_a_typed_error_naming_it(base, tmp_path):
    (path,) = packer.view(base, tmp_path / "v.pkview", classes="dog")
    data = bytearray(path.read_bytes())
    data[HEADER + 3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(errors.ChecksumMismatchError, match=f"^{path}: view file checksum mismatch"):
        packer.open_dataset(path)
    path.write_bytes(bytes(data[:70]))
    with pytest.raises(errors.TruncatedFileError, match="(truncated)"):
        packer.open_dataset(path)
    code, out, err = run_main(["verify", str(path), "--json"])
    assert code == 1 and json.loads(out)["problems"][0]["kind"] == "structure"


def test_verify_checks_only_the_selected_samples(base, tmp_path):
    data = shutil.copytree(base, tmp_path / "ds")
    (path,) = packer.view(data, tmp_path / "v.pkview", classes="dog")
    code, out, _ = run_main(["verify", str(path), "--json", "--decode"])
    report = json.loads(out)
    assert code == 0 and report["samples"] == report["samples_checked"] == 8
    with packer.open_dataset(data) as ds:
        cat = next(i for i in range(len(ds)) if ds.labels[i] == 0)
        dog = next(i for i in range(len(ds)) if ds.labels[i] == 1)
        info = {i: (ds.manifest.shards[ds.shard_of(i)].path, int(ds.index.offset[i])) for i in (cat, dog)}
    shard, offset = info[cat]
    with open(data / shard, "r+b") as handle:  # damage a sample the view leaves out
        handle.seek(offset + 5)
        byte = handle.read(1)
        handle.seek(offset + 5)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert run_main(["verify", str(path)])[0] == 0
    assert run_main(["verify", str(data)])[0] == 1
    shard, offset = info[dog]
    with open(data / shard, "r+b") as handle:
        handle.seek(offset + 5)
        byte = handle.read(1)
        handle.seek(offset + 5)
        handle.write(bytes([byte[0] ^ 0xFF]))
    code, out, _ = run_main(["verify", str(path), "--json"])
    problems = json.loads(out)["problems"]
    assert code == 1 and [p["kind"] for p in problems] == ["checksum"] and problems[0]["key"].startswith("dog/")
    assert problems[0]["message"].startswith("payload checksum mismatch")


def test_export_writes_the_views_samples(base, tmp_path):
    (path,) = packer.view(base, tmp_path / "v.pkview", classes="emu")
    code, out, err = run_main(["export", str(path), str(tmp_path / "out"), "--json"])
    assert code == 0, err
    files = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.*"))
    with packer.open_dataset(path) as view:
        assert files == sorted(view.keys()) and len(files) == 4


def test_a_view_of_a_view_is_written_against_the_dataset(base, tmp_path):
    (first,) = packer.view(base, tmp_path / "a" / "v.pkview", classes="cat,dog")
    (second,) = packer.view(first, tmp_path / "b" / "w.pkview", where="class == dog")
    parsed = parse_view(second.read_bytes())
    assert parsed.base == "../../" + base.parent.name + "/ds" or Path(parsed.base).name == "ds"
    assert parsed.selectors[0]["view_of"] == str(first) and parsed.selectors[1] == {"where": "class == dog"}
    with packer.open_dataset(second) as view:
        assert set(view.labels.tolist()) == {1} and len(view) == 8


def test_a_view_moves_with_its_dataset_when_both_move(base, tmp_path):
    shutil.copytree(base, tmp_path / "one" / "ds")
    packer.view(tmp_path / "one" / "ds", tmp_path / "one" / "v.pkview", classes="dog")
    shutil.move(tmp_path / "one", tmp_path / "two")
    with packer.open_dataset(tmp_path / "two" / "v.pkview") as view:
        assert len(view) == 8 and view.place.folder == tmp_path / "two" / "ds"


def test_out_exists_or_is_a_folder_or_a_url(base, tmp_path):
    (path,) = packer.view(base, tmp_path / "v.pkview", classes="dog")
    with pytest.raises(errors.OutputExistsError, match="exists: pass overwrite=True"):
        packer.view(base, path, classes="cat")
    packer.view(base, path, classes="cat", overwrite=True)
    assert len(packer.open_dataset(path)) == 6
    (tmp_path / "folder").mkdir()
    with pytest.raises(errors.OptionError, match="is a folder; a view is a file"):
        packer.view(base, tmp_path / "folder", overwrite=True)
    with pytest.raises(errors.OptionError, match="OUT needs a local path, got the URL s3://b/v.pkview"):
        packer.view(base, "s3://b/v.pkview")
    with pytest.raises(errors.OptionError, match="--seed must be an integer"):
        packer.view(base, tmp_path / "s.pkview", seed=-1)


def test_exclude_duplicates_of_drops_the_samples_with_a_copy(tmp_path):
    write_images(tmp_path / "train", {"cat": 5, "dog": 5}, size=24)
    (tmp_path / "val" / "cat").mkdir(parents=True)
    shutil.copy(tmp_path / "train" / "cat" / "001.jpg", tmp_path / "val" / "cat" / "x.jpg")
    shutil.copy(tmp_path / "train" / "dog" / "003.jpg", tmp_path / "val" / "cat" / "y.jpg")
    write_images(tmp_path / "val2", {"cat": 2}, seed=42, size=24)
    shutil.copytree(tmp_path / "val2" / "cat", tmp_path / "val" / "cat", dirs_exist_ok=True)
    packer.build_dataset(tmp_path / "train", tmp_path / "train-ds")
    packer.build_dataset(tmp_path / "val", tmp_path / "val-ds")
    (path,) = packer.view(tmp_path / "train-ds", tmp_path / "clean.pkview", exclude_duplicates_of=tmp_path / "val-ds")
    with packer.open_dataset(path) as view:
        kept = set(view.keys())
    assert "cat/001.jpg" not in kept and "dog/003.jpg" not in kept and len(kept) == 8
    assert parse_view(path.read_bytes()).selectors[-1]["removed"] == 2
    # one dataset split in two views: the train part leaves out copies of the val part's samples
    shutil.copy(tmp_path / "train" / "cat" / "001.jpg", tmp_path / "train" / "dog" / "copy.jpg")
    packer.build_dataset(tmp_path / "train", tmp_path / "both")
    parts = packer.view(tmp_path / "both", tmp_path / "p", split="0.5:0.5", seed=0)
    with packer.open_dataset(parts[0]) as a, packer.open_dataset(parts[1]) as b:
        together = {*a.keys()} | {*b.keys()}
        side = 0 if "cat/001.jpg" in set(a.keys()) else 1
        copy_side = 0 if "dog/copy.jpg" in set(a.keys()) else 1
    assert together >= {"cat/001.jpg", "dog/copy.jpg"}
    (clean,) = packer.view(parts[side], tmp_path / "c.pkview", exclude_duplicates_of=parts[1 - side])
    with packer.open_dataset(clean) as view:
        dropped = "cat/001.jpg" not in set(view.keys())
    assert dropped == (side != copy_side)


def test_the_cli_writes_views_and_prints_them(base, tmp_path):
    code, out, err = run_main(["view", str(base), str(tmp_path / "v.pkview"), "--classes", "dog", "--json"])
    assert code == 0, err
    assert json.loads(out)["views"] == [{"path": str(tmp_path / "v.pkview"), "samples": 8, "of": 18}]
    code, out, err = run_main(["view", str(base), str(tmp_path / "s"), "--split", "0.5:0.5", "--seed", "3"])
    assert code == 0 and "wrote " + str(tmp_path / "s-0.pkview") in err and (tmp_path / "s-1.pkview").is_file()
    code, out, err = run_main(["view", str(base), str(tmp_path / "v.pkview"), "--classes", "dog"])
    assert code == 2 and "exists: pass overwrite=True (--overwrite)" in err
    code, out, err = run_main(["view", str(base), str(tmp_path / "none.pkview"), "--where", "label > 100"])
    assert code == 0 and err.strip().endswith(": 0 of 18 samples (warning: the selection is empty: a reader of "
                                              "this view reads nothing)")
    code, out, err = run_main(["inspect", str(tmp_path / "v.pkview"), "--json"])
    summary = json.loads(out)
    assert code == 0 and summary["samples"] == 8 and summary["view"]["base_samples"] == 18
    assert summary["view"]["selectors"] == [{"classes": ["dog"]}]
    code, out, err = run_main(["inspect", str(tmp_path / "v.pkview")])
    assert "view       8 of the 18 samples of" in out

