"""``--reject-duplicates`` (``CheckSettings.reject_duplicates``): a file with the bytes of a file
listed before it is rejected as ``duplicate-content`` naming the one kept, from every door (folder,
tar, Python Writer), recorded, and applied by ``append`` against the samples already there.

Each test can fail: the kept key is checked, not only the count; same-size files with other bytes
and a forced checksum collision must stay; the rejection must not depend on ``--seed``.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from helpers import png_bytes, run_main

import packer
from packer import BuildSettings, CheckSettings, LayoutSettings, RunOptions
from packer.errors import EmptySourceError, OptionError

ONE = RunOptions(workers=1)
REJECTING = BuildSettings(checks=CheckSettings(reject_duplicates=True), layout=LayoutSettings(shard_size=16 << 10))


def source(root: Path) -> Path:
    """Six PNGs of one size (same-size files with other bytes), two of them copied under other names."""
    for number in range(6):
        folder = root / ("cat" if number % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{number}.png").write_bytes(png_bytes(number, (12, 16)))
    shutil.copy(root / "dog" / "0.png", root / "dog" / "copy-of-dog-0.png")
    shutil.copy(root / "cat" / "1.png", root / "dog" / "z-copy-of-cat-1.png")
    shutil.copy(root / "cat" / "1.png", root / "cat" / "z-copy-of-cat-1.png")
    return root


def rejections(path: Path) -> dict[str, str]:
    lines = [json.loads(line) for line in (path / "build-report.jsonl").read_text().splitlines()]
    return {line["key"]: line["message"] for line in lines if line.get("reason") == "duplicate-content"}


def keys(path: Path) -> set[str]:
    with packer.open_dataset(path) as dataset:
        return {dataset.key(i) for i in range(len(dataset))}


#: the first in the listing's order (sorted keys: cat/ before dog/, "0.png" before "copy-...") is kept
EXPECTED = {"dog/copy-of-dog-0.png": "the same bytes as 'dog/0.png', which is kept",
            "cat/z-copy-of-cat-1.png": "the same bytes as 'cat/1.png', which is kept",
            "dog/z-copy-of-cat-1.png": "the same bytes as 'cat/1.png', which is kept"}


def test_the_cli_rejects_later_copies_naming_the_kept_one_whatever_the_seed(tmp_path: Path) -> None:
    src = source(tmp_path / "src")
    for seed in ("0", "7"):
        out = tmp_path / f"ds-{seed}"
        code, stdout, err = run_main(["build", str(src), str(out), "--reject-duplicates", "--seed", seed,
                                      "--workers", "2", "--shard-size", "16K", "--quiet", "--json"])
        assert code == 0, err
        summary = json.loads(stdout)
        assert summary["samples"] == 6 and summary["rejected_by_reason"] == {"duplicate-content": 3}
        assert rejections(out) == EXPECTED  # the first in the listing's order is kept, not the first packed
        assert keys(out) == {f"{'cat' if n % 2 else 'dog'}/{n}.png" for n in range(6)}
        with packer.open_dataset(out) as dataset:
            assert dataset.manifest.build["settings"]["checks"]["reject_duplicates"] is True
    # without the option every copy is packed, and the record is what earlier builds wrote
    code, _, err = run_main(["build", str(src), str(tmp_path / "plain"), "--quiet"])
    assert code == 0, err
    assert len(keys(tmp_path / "plain")) == 9
    with packer.open_dataset(tmp_path / "plain") as dataset:
        assert "reject_duplicates" not in dataset.manifest.build["settings"]["checks"]


def test_a_tar_and_the_writer_reject_the_same_copies(tmp_path: Path) -> None:
    src = source(tmp_path / "src")
    with tarfile.open(tmp_path / "src.tar", "w") as archive:
        for file in sorted(p for p in src.rglob("*") if p.is_file()):
            archive.add(file, arcname=file.relative_to(src).as_posix())
    result = packer.build_dataset(tmp_path / "src.tar", tmp_path / "from-tar", REJECTING, ONE)
    assert result.sample_count == 6 and rejections(tmp_path / "from-tar") == EXPECTED
    assert sorted(r.key for r in result.rejected if r.reason == "duplicate-content") == sorted(EXPECTED)
    with packer.Writer(tmp_path / "from-writer", settings=REJECTING, run=ONE) as writer:
        for file in sorted(p for p in src.rglob("*") if p.is_file()):
            writer.write(file.read_bytes(), file.parent.name, key=file.relative_to(src).as_posix())
    assert rejections(tmp_path / "from-writer") == EXPECTED
    assert keys(tmp_path / "from-writer") == keys(tmp_path / "from-tar")


def test_equal_checksums_with_other_bytes_are_not_duplicates(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes are compared: a forced xxh3 collision (every file hashing alike) rejects only real copies."""
    import packer.writer.dedupe as dedupe

    monkeypatch.setattr(dedupe.fmt, "checksum", lambda data: 42)
    src = source(tmp_path / "src")
    packer.build_dataset(src, tmp_path / "ds", REJECTING, ONE)
    assert rejections(tmp_path / "ds") == EXPECTED


def test_a_copy_over_the_size_limit_is_rejected_for_its_size_not_read(tmp_path: Path) -> None:
    src = source(tmp_path / "src")
    (src / "cat" / "big.png").write_bytes(png_bytes(50, (40, 40)))
    shutil.copy(src / "cat" / "big.png", src / "cat" / "big-copy.png")
    settings = BuildSettings(checks=CheckSettings(reject_duplicates=True,
                                                  max_file_size=(src / "dog" / "0.png").stat().st_size))
    result = packer.build_dataset(src, tmp_path / "ds", settings, ONE)
    assert {r.key: r.reason for r in result.rejected} == {**{key: "duplicate-content" for key in EXPECTED},
                                                          "cat/big.png": "file-too-large",
                                                          "cat/big-copy.png": "file-too-large"}


def test_append_rejects_copies_of_samples_already_in_the_dataset(tmp_path: Path) -> None:
    src = source(tmp_path / "src")
    packer.build_dataset(src, tmp_path / "ds", REJECTING, ONE)
    more = tmp_path / "more" / "cat"
    more.mkdir(parents=True)
    shutil.copy(src / "dog" / "2.png", more / "again-dog-2.png")  # in the dataset already
    (more / "new.png").write_bytes(png_bytes(100, (12, 16)))
    shutil.copy(more / "new.png", more / "newer.png")  # a copy among the new files
    result = packer.append_dataset(tmp_path / "ds", tmp_path / "more", run=ONE)
    assert result.sample_count == 7
    assert {r.key: r.message for r in result.rejected} == {
        "cat/again-dog-2.png": "the same bytes as 'dog/2.png', already in the dataset",
        "cat/newer.png": "the same bytes as 'cat/new.png', which is kept"}
    assert rejections(tmp_path / "ds") == {**EXPECTED, "cat/again-dog-2.png":
                                           "the same bytes as 'dog/2.png', already in the dataset",
                                           "cat/newer.png": "the same bytes as 'cat/new.png', which is kept"}
    only = tmp_path / "only-copies" / "dog"
    only.mkdir(parents=True)
    shutil.copy(src / "dog" / "4.png", only / "4-again.png")
    with pytest.raises(EmptySourceError) as caught:
        packer.append_dataset(tmp_path / "ds", tmp_path / "only-copies", run=ONE)
    assert caught.value.message == ("every file of the new source has the bytes of a sample already in the dataset "
                                    "(1 rejected as duplicate-content; --reject-duplicates is recorded in the "
                                    "dataset's build settings)")
    assert len(keys(tmp_path / "ds")) == 7


def test_append_to_a_dataset_built_without_the_option_keeps_copies(tmp_path: Path) -> None:
    src = source(tmp_path / "src")
    packer.build_dataset(src, tmp_path / "ds", BuildSettings(), ONE)
    (tmp_path / "more" / "cat").mkdir(parents=True)
    shutil.copy(src / "dog" / "2.png", tmp_path / "more" / "cat" / "again.png")
    assert packer.append_dataset(tmp_path / "ds", tmp_path / "more", run=ONE).sample_count == 10


def test_the_setting_is_checked_recorded_and_named_on_resume(tmp_path: Path) -> None:
    with pytest.raises(OptionError) as caught:
        BuildSettings(checks=CheckSettings(reject_duplicates="yes")).check()
    assert caught.value.message == "--reject-duplicates is a flag (True or False), got 'yes'"
    assert BuildSettings.from_json(REJECTING.to_json()) == REJECTING
    src = source(tmp_path / "src")
    packer.build_dataset(src, tmp_path / "ds", BuildSettings(), ONE)
    code, _, err = run_main(["build", str(src), str(tmp_path / "ds"), "--resume", "--reject-duplicates", "--quiet"])
    assert code == 3 and "--reject-duplicates: built not given, asked given" in err
