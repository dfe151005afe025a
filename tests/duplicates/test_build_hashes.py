"""``packer build --hash perceptual``: every sample hashed by the worker that packs it, kept in the
hashes file beside the index (SPEC §16), kept by ``append``, checked by ``verify``, and used by
``packer inspect --duplicates`` instead of decoding again; from every door (folder, tar, Writer).

Each test compares the stored hashes with ``hash_dataset`` of the finished dataset (what inspect
computes when nothing is stored), so a worker that hashed the source instead of the payload, a
row out of index order or an append that dropped the old hashes fails here.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from helpers import encode, photo_like, run_main

import packer
from packer import BuildSettings, LayoutSettings, RunOptions
from packer import format as fmt
from packer.duplicates import phash
from packer.duplicates.phash import FLAT, HASHED, UNREADABLE, HashTable, hash_dataset
from packer.duplicates.sidecar import encode_hashes, load_or_compute, parse_hashes
from packer.errors import OptionError
from packer.verify import verify

ONE = RunOptions(workers=1)
HASHED_BUILD = BuildSettings(layout=LayoutSettings(shard_size=64 << 10), hash="perceptual")


def photos(root: Path, count: int = 6, first: int = 0) -> Path:
    for number in range(first, first + count):
        folder = root / f"c{number % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        kind = "png" if number % 3 == 0 else "jpg"
        (folder / f"p{number:02d}.{kind}").write_bytes(encode(photo_like(number, (48, 64)), kind))
    return root


def stored(path: Path) -> HashTable:
    """The hashes file, checked against the dataset's index (identity included)."""
    with packer.open_dataset(path) as dataset:
        return parse_hashes((path / fmt.HASHES_NAME).read_bytes(), index_checksum=dataset.manifest.index.checksum,
                            sample_count=len(dataset))


def recomputed(path: Path) -> HashTable:
    with packer.open_dataset(path) as dataset:
        return hash_dataset(dataset)


def assert_stored_hashes_are_the_datasets(path: Path) -> HashTable:
    kept, fresh = stored(path), recomputed(path)
    assert kept.status.tolist() == fresh.status.tolist()
    assert np.array_equal(kept.hashes, fresh.hashes)
    return kept


def test_a_folder_build_keeps_the_hashes_and_inspect_uses_them(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    photos(tmp_path / "src")
    code, out, err = run_main(["build", str(tmp_path / "src"), str(tmp_path / "ds"), "--hash", "perceptual",
                               "--workers", "2", "--shard-size", "16K", "--quiet", "--json"])
    assert code == 0, err
    table = assert_stored_hashes_are_the_datasets(tmp_path / "ds")
    assert table.counts() == {"hashed": 6, "flat": 0, "unreadable": 0}
    with packer.open_dataset(tmp_path / "ds") as dataset:
        assert dataset.manifest.build["settings"]["hash"] == "perceptual" and len(dataset.manifest.shards) > 1

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("inspect decoded the images again instead of using the stored hashes")

    monkeypatch.setattr(phash, "hash_dataset", no_decoding)
    import packer.duplicates.sidecar as sidecar

    monkeypatch.setattr(sidecar, "hash_dataset", no_decoding)
    code, out, err = run_main(["inspect", str(tmp_path / "ds"), "--duplicates", "--json"])
    assert code == 0, err
    assert json.loads(out)["duplicates"]["datasets"][0]["hashes_source"] == "stored"


def test_a_tar_build_and_the_writer_hash_the_same_images_the_same(tmp_path: Path) -> None:
    photos(tmp_path / "src")
    with tarfile.open(tmp_path / "src.tar", "w") as archive:
        for file in sorted(p for p in (tmp_path / "src").rglob("*") if p.is_file()):
            archive.add(file, arcname=file.relative_to(tmp_path / "src").as_posix())
    packer.build_dataset(tmp_path / "src.tar", tmp_path / "from-tar", HASHED_BUILD, ONE)
    from_tar = assert_stored_hashes_are_the_datasets(tmp_path / "from-tar")
    with packer.Writer(tmp_path / "from-writer", settings=HASHED_BUILD, run=ONE) as writer:
        for file in sorted(p for p in (tmp_path / "src").rglob("*") if p.is_file()):
            writer.write(file.read_bytes(), file.parent.name, key=file.relative_to(tmp_path / "src").as_posix())
    from_writer = assert_stored_hashes_are_the_datasets(tmp_path / "from-writer")
    by_key = {}
    for path, table in (("from-tar", from_tar), ("from-writer", from_writer)):
        with packer.open_dataset(tmp_path / path) as dataset:
            by_key[path] = {dataset.key(i): table.hashes[i].tolist() for i in range(len(dataset))}
    assert by_key["from-tar"] == by_key["from-writer"] and len(by_key["from-tar"]) == 6


def test_raw_payloads_and_flat_images_are_hashed_as_inspect_hashes_them(tmp_path: Path) -> None:
    """The raw codec stores pixels (hashed as pixels, not decoded); a blank image is flat."""
    photos(tmp_path / "src", count=3)
    (tmp_path / "src" / "c0" / "blank.png").write_bytes(encode(np.full((30, 40, 3), 128, np.uint8), "png"))
    settings = BuildSettings(codec="raw:size=24x32", hash="perceptual")
    packer.build_dataset(tmp_path / "src", tmp_path / "raw", settings, ONE)
    table = assert_stored_hashes_are_the_datasets(tmp_path / "raw")
    assert sorted(table.status.tolist()) == [HASHED, HASHED, HASHED, FLAT]


def test_an_image_that_does_not_decode_is_stored_as_unreadable_and_verifies(tmp_path: Path) -> None:
    """--validate header lets a JPEG with a damaged body through: its hash is 'unreadable', both ways."""
    photos(tmp_path / "src", count=2)
    good = encode(photo_like(9, (48, 64)), "jpg")
    damaged = good[:200] + bytes(len(good) - 202) + good[-2:]
    (tmp_path / "src" / "c1" / "damaged.jpg").write_bytes(damaged)
    packer.build_dataset(tmp_path / "src", tmp_path / "ds", HASHED_BUILD, ONE)
    with packer.open_dataset(tmp_path / "ds") as dataset:
        keys = [dataset.key(i) for i in range(len(dataset))]
    if "c1/damaged.jpg" not in keys:
        pytest.skip("this Pillow refuses the damaged JPEG's header")
    table = assert_stored_hashes_are_the_datasets(tmp_path / "ds")
    assert table.status[keys.index("c1/damaged.jpg")] == UNREADABLE
    assert verify(tmp_path / "ds", workers=1).ok


def test_append_hashes_the_new_samples_and_keeps_the_old_ones(tmp_path: Path) -> None:
    photos(tmp_path / "src", count=4)
    packer.build_dataset(tmp_path / "src", tmp_path / "ds", HASHED_BUILD, ONE)
    before = stored(tmp_path / "ds")
    packer.append_dataset(tmp_path / "ds", photos(tmp_path / "more", count=3, first=10), run=ONE)
    after = assert_stored_hashes_are_the_datasets(tmp_path / "ds")
    assert len(after) == 7 and np.array_equal(after.hashes[:4], before.hashes)
    # an append to a dataset whose hashes file went missing computes the old samples' again
    (tmp_path / "ds" / fmt.HASHES_NAME).unlink()
    packer.append_dataset(tmp_path / "ds", photos(tmp_path / "again", count=2, first=20), run=ONE)
    assert len(assert_stored_hashes_are_the_datasets(tmp_path / "ds")) == 9
    assert verify(tmp_path / "ds", workers=1).ok


def test_verify_reports_a_hash_that_is_not_its_images(tmp_path: Path) -> None:
    photos(tmp_path / "src", count=4)
    packer.build_dataset(tmp_path / "src", tmp_path / "ds", HASHED_BUILD, ONE)
    report = verify(tmp_path / "ds", workers=1)
    assert report.ok and report.hashes == {"samples_checked": 4, "problems": 0}
    assert report.to_json()["hashes"] == report.hashes
    table = stored(tmp_path / "ds")
    with packer.open_dataset(tmp_path / "ds") as dataset:
        checksum, key = dataset.manifest.index.checksum, dataset.key(2)
    table.hashes[2, 0] ^= np.uint64(0xFFFF)  # 16 bits: another image's hash, rewritten with a valid checksum
    table.status[3] = FLAT
    (tmp_path / "ds" / fmt.HASHES_NAME).write_bytes(encode_hashes(table, checksum))
    report = verify(tmp_path / "ds", workers=1)
    assert not report.ok and report.hashes == {"samples_checked": 4, "problems": 2}
    assert [(p.kind, p.sample) for p in report.problems] == [("hashes", 2), ("hashes", 3)]
    assert report.problems[0].key == key
    assert report.problems[0].message == ("the stored perceptual hash differs from its image's recomputed hash "
                                          "in 16 of 128 bits")
    assert report.problems[1].message == "the stored perceptual hash is stored as flat, recomputed as hashed"
    code, out, _ = run_main(["verify", str(tmp_path / "ds"), "--json", "--quiet"])
    assert code == 1 and json.loads(out)["hashes"]["problems"] == 2


def test_verify_reports_a_missing_stale_or_oversized_hashes_file(tmp_path: Path) -> None:
    photos(tmp_path / "src", count=3)
    packer.build_dataset(tmp_path / "src", tmp_path / "ds", HASHED_BUILD, ONE)
    path = tmp_path / "ds" / fmt.HASHES_NAME
    good = path.read_bytes()
    path.write_bytes(good + bytes(8))
    report = verify(tmp_path / "ds", workers=1)
    assert [p.kind for p in report.problems] == ["hashes"]
    assert report.problems[0].message == (f"{fmt.HASHES_NAME} is unusable: {fmt.HASHES_NAME} is larger than a "
                                          f"hashes file of 3 samples")
    table = parse_hashes(good)
    path.write_bytes(encode_hashes(table, 12345))  # for another index: stale
    assert "stale hashes" in verify(tmp_path / "ds", workers=1).problems[0].message
    path.unlink()
    report = verify(tmp_path / "ds", workers=1)
    assert not report.ok and report.hashes == {"samples_checked": 0, "problems": 1}
    assert report.problems[0].message == (f"the build recorded --hash perceptual, but {fmt.HASHES_NAME} is missing "
                                          f"(`packer inspect --duplicates` writes it again)")
    # a build without --hash keeps no hashes and verify asks for none
    packer.build_dataset(tmp_path / "src", tmp_path / "plain", BuildSettings(), ONE)
    report = verify(tmp_path / "plain", workers=1)
    assert report.ok and report.hashes is None and "hashes" not in report.to_json()


def test_the_hash_setting_is_recorded_only_when_asked_and_checked() -> None:
    assert "hash" not in BuildSettings().to_json()  # a build without it records what earlier builds did
    assert BuildSettings(hash="perceptual").to_json()["hash"] == "perceptual"
    assert BuildSettings.from_json(BuildSettings(hash="perceptual").to_json()) == BuildSettings(hash="perceptual")
    with pytest.raises(OptionError) as caught:
        BuildSettings(hash="md5").check()
    assert caught.value.message == "--hash must be one of none, perceptual, got 'md5'"
    with pytest.raises(OptionError) as caught:
        BuildSettings.from_json({"hash": "md5"})
    assert caught.value.message == "build settings: hash is 'md5'; expected one of none, perceptual"
    assert BuildSettings.from_json({"hash": "md5"}, strict=False) == BuildSettings()
    assert BuildSettings().differences(BuildSettings(hash="perceptual"), then="built") == [
        "--hash: built 'none', asked 'perceptual'"]


def test_resume_of_a_dataset_built_without_hashes_is_refused_by_name(tmp_path: Path) -> None:
    photos(tmp_path / "src", count=2)
    packer.build_dataset(tmp_path / "src", tmp_path / "ds", BuildSettings(), ONE)
    code, _, err = run_main(["build", str(tmp_path / "src"), str(tmp_path / "ds"), "--resume", "--hash",
                             "perceptual", "--quiet"])
    assert code == 3 and "--hash: built 'none', asked 'perceptual'" in err


def test_a_view_reads_its_rows_of_the_datasets_hashes_and_never_replaces_the_file(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A view's --duplicates takes its rows of the hashes file beside the dataset's index; without
    a valid file it hashes its own samples and stores nothing: the file is the whole dataset's (a
    view's table there would make the dataset's verify fail)."""
    photos(tmp_path / "src", count=8)
    packer.build_dataset(tmp_path / "src", tmp_path / "ds", HASHED_BUILD, ONE)
    (view,) = packer.view(tmp_path / "ds", tmp_path / "c1.pkview", classes="c1")
    whole = stored(tmp_path / "ds")
    before = (tmp_path / "ds" / fmt.HASHES_NAME).read_bytes()
    code, out, err = run_main(["inspect", str(view), "--duplicates", "--json"])
    assert code == 0, err
    entry = json.loads(out)["duplicates"]["datasets"][0]
    assert entry["hashes_source"] == "stored (the dataset's)" and entry["hashes"]["hashed"] == 4
    with packer.open_dataset(view) as opened:
        table, _ = load_or_compute(opened)
        assert np.array_equal(table.hashes, whole.hashes[opened.base_rows])
    (tmp_path / "ds" / fmt.HASHES_NAME).write_bytes(before[:-1])  # damaged: the view computes its own
    code, out, err = run_main(["inspect", str(view), "--duplicates", "--json"])
    assert code == 0, err
    assert json.loads(out)["duplicates"]["datasets"][0]["hashes_source"] == "computed (a view's samples; not stored)"
    assert (tmp_path / "ds" / fmt.HASHES_NAME).read_bytes() == before[:-1]  # not replaced by the view's
    (tmp_path / "ds" / fmt.HASHES_NAME).write_bytes(before)
    assert verify(tmp_path / "ds").ok
