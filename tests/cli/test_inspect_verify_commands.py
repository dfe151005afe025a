"""The inspect and verify commands: output, --json documents and exit codes (0 ok, 1 damaged,
2 usage, 3 I/O)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.writer import build
from packer.cli import _register, cli
from packer.dataset import open_dataset, open_index
from packer.inspect.grid import CAPTION_HEIGHT
from packer import BuildSettings, LayoutSettings, RunOptions

_register()


def make_images(root: Path) -> Path:
    rng = np.random.default_rng(2)
    for name, count in (("cat", 2), ("dog", 3)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (20 + i, 28, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    build(make_images(tmp / "src"), tmp / "ds", BuildSettings(layout=LayoutSettings(shard_size=12 << 10)), RunOptions(workers=1))
    return tmp / "ds"


@pytest.fixture
def dataset(base: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base, tmp_path / "ds"))


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def one_json_document(text: str) -> dict:
    document = json.loads(text)  # raises if stdout holds anything but one document
    assert text.strip() == json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False)  # sorted keys
    assert document["format_version"] == 1
    return document


def damage(folder: Path, sample: int) -> None:
    with open_index(folder) as index:
        path = folder / index.manifest.shards[index.shard_of(sample)].path
        offset = int(index.index.offset[sample]) + 7
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 1]))


# --- verify ----------------------------------------------------------------------------------

def test_verify_intact_exits_0(base: Path) -> None:
    result = run("verify", base, "--quiet")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("OK: 5 of 5 samples")


def test_verify_damaged_exits_1_and_names_the_sample(dataset: Path) -> None:
    damage(dataset, 3)
    with open_index(dataset) as index:
        key, shard = index.key(3), index.shard_of(3)
    result = run("verify", dataset, "-q")
    assert result.exit_code == 1
    assert f"[checksum] shard {shard}, sample 3 ({key}): payload checksum mismatch" in result.stdout
    assert "DAMAGED: 2 problem(s), 1 damaged sample(s)" in result.stdout


def test_verify_json(dataset: Path) -> None:
    result = run("verify", dataset, "--json", "-q")
    assert result.exit_code == 0
    document = one_json_document(result.stdout)
    assert document["ok"] is True and document["samples_checked"] == 5 and document["problems"] == []
    damage(dataset, 0)
    result = run("verify", dataset, "--json", "--workers", "2")
    assert result.exit_code == 1
    document = one_json_document(result.stdout)
    assert document["ok"] is False and document["damaged_sample_count"] == 1
    assert [p["sample"] for p in document["problems"] if p["kind"] == "checksum"] == [0]
    assert "verifying" in result.stderr  # the progress bar goes to stderr, never stdout


def test_verify_decode(base: Path) -> None:
    result = run("verify", base, "--decode", "-q")
    assert result.exit_code == 0 and "checked and decoded" in result.stdout


def test_verify_structure_damage_exits_1(dataset: Path) -> None:
    (dataset / "manifest.json").write_text("{}")
    result = run("verify", dataset, "-q", "--json")
    assert result.exit_code == 1
    document = one_json_document(result.stdout)
    assert document["problems"][0]["kind"] == "structure"


def test_verify_missing_shard_exits_1(dataset: Path) -> None:
    with open_index(dataset) as index:
        (dataset / index.manifest.shards[0].path).unlink()
    result = run("verify", dataset, "-q")
    assert result.exit_code == 1 and "[missing] shard 0" in result.stdout


def test_verify_accepts_the_manifest_path(base: Path) -> None:
    assert run("verify", base / "manifest.json", "-q").exit_code == 0


@pytest.mark.parametrize("args", [[], ["/no/such/dataset"], ["--no-such-option"], ["--workers", "0"]])
def test_verify_usage_errors_exit_2(base: Path, args: list[str]) -> None:
    extra = [base] if args and args[0].startswith("--") else []
    assert run("verify", *extra, *args).exit_code == 2


# --- inspect -----------------------------------------------------------------------------------

def test_inspect_summary(base: Path) -> None:
    result = run("inspect", base)
    assert result.exit_code == 0
    out = result.stdout
    assert "samples    5 in" in out and "classes    2" in out
    counts = dict(line.split() for line in out.splitlines() if line.startswith(("  cat", "  dog")))
    assert counts == {"cat": "2", "dog": "3"}


def test_inspect_json(base: Path) -> None:
    result = run("inspect", base, "--json")
    assert result.exit_code == 0
    document = one_json_document(result.stdout)
    assert document["samples"] == 5 and document["ok"] is True
    assert [(c["name"], c["count"]) for c in document["classes"]] == [("cat", 2), ("dog", 3)]
    assert {"bytes", "alignment", "codec", "build", "images", "rejected", "shards"} <= set(document)


def test_inspect_sample_by_index_and_key(base: Path) -> None:
    with open_index(base) as index:
        key = index.key(4)
    by_index = one_json_document(run("inspect", base, "--sample", 4, "--json").stdout)["sample"]
    by_key = one_json_document(run("inspect", base, "--sample", key, "--json").stdout)["sample"]
    assert by_index == by_key and by_index["index"] == 4 and by_index["key"] == key
    assert one_json_document(run("inspect", base, "--sample", -1, "--json").stdout)["sample"]["index"] == 4
    text = run("inspect", base, "--sample", key).stdout
    assert f"key        {key}" in text and "checksum" in text


@pytest.mark.parametrize("sample", ["99", "-6", "no/such/key.jpg"])
def test_inspect_unknown_sample_exits_2(base: Path, sample: str) -> None:
    result = run("inspect", base, "--sample", sample)
    assert result.exit_code == 2


def test_extract_writes_exactly_the_bytes(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.bin"
    result = run("inspect", base, "--sample", 2, "--extract", out, "--json")
    assert result.exit_code == 0
    with open_dataset(base) as ds:
        expected = ds.read(2)
    assert out.read_bytes() == expected
    document = one_json_document(result.stdout)
    assert document["extracted"] == {"path": str(out), "bytes": len(expected)}
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]  # nothing derived from the key


def test_extract_refuses_to_overwrite(base: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    out.write_bytes(b"keep me")
    result = run("inspect", base, "--sample", 0, "--extract", out)
    assert result.exit_code == 2 and "already exists" in result.stderr
    assert out.read_bytes() == b"keep me"
    assert run("inspect", base, "--sample", 0, "--extract", out, "--force").exit_code == 0
    with open_dataset(base) as ds:
        assert out.read_bytes() == ds.read(0)


def test_extract_never_writes_through_a_symlink(base: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"precious")
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    for extra in ([], ["--force"]):
        result = run("inspect", base, "--sample", 0, "--extract", link, *extra)
        assert result.exit_code == 2
        assert target.read_bytes() == b"precious"


def test_extract_needs_sample(base: Path, tmp_path: Path) -> None:
    assert run("inspect", base, "--extract", tmp_path / "x.bin").exit_code == 2
    assert not (tmp_path / "x.bin").exists()


def test_extract_io_error_exits_3(base: Path, tmp_path: Path) -> None:
    result = run("inspect", base, "--sample", 0, "--extract", tmp_path / "no-such-folder" / "x.bin")
    assert result.exit_code == 3 and "cannot write" in result.stderr


def test_extract_of_a_damaged_sample_exits_1(dataset: Path, tmp_path: Path) -> None:
    damage(dataset, 1)
    result = run("inspect", dataset, "--sample", 1, "--extract", tmp_path / "x.bin")
    assert result.exit_code == 1 and "checksum mismatch" in result.stderr
    assert not (tmp_path / "x.bin").exists()


def test_grid_writes_a_png(base: Path, tmp_path: Path) -> None:
    out = tmp_path / "sheet.png"
    result = run("inspect", base, "--grid", out, "--grid-count", 4, "--grid-columns", 3, "--json")
    assert result.exit_code == 0
    grid = one_json_document(result.stdout)["grid"]
    with Image.open(out) as image:
        assert image.format == "PNG"
        assert image.size == (3 * 96, 2 * (96 + CAPTION_HEIGHT)) == (grid["width"], grid["height"])
    assert len(grid["samples"]) == 4 and grid["failed"] == []
    assert run("inspect", base, "--grid", out).exit_code == 2  # exists
    assert run("inspect", base, "--grid", out, "--force").exit_code == 0
    assert run("inspect", base, "--grid", tmp_path / "missing" / "g.png").exit_code == 3


def test_inspect_damaged_index_exits_1_with_a_json_error(dataset: Path) -> None:
    with open_index(dataset) as index:
        path = dataset / index.manifest.index.path
    with open(path, "ab") as handle:
        handle.write(b"\0")
    result = run("inspect", dataset, "--json")
    assert result.exit_code == 1
    document = one_json_document(result.stdout)
    assert document["ok"] is False and document["error"] == "TruncatedFileError"


def test_inspect_usage_errors_exit_2(tmp_path: Path) -> None:
    assert run("inspect").exit_code == 2
    assert run("inspect", tmp_path / "nope").exit_code == 2


def test_python_m_packer_help() -> None:
    for args, fragment in (([], "verify"), (["inspect"], "--extract"), (["verify"], "--decode")):
        done = subprocess.run([sys.executable, "-m", "packer", *args, "--help"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert "Usage:" in done.stdout and fragment in done.stdout


def test_inspect_writes_only_a_new_regular_file(dataset: Path, tmp_path: Path) -> None:
    """--extract and --grid refuse a folder or a device in place of the file (exit 2), and name a
    file that cannot be written (exit 3), without writing through any of them."""
    (tmp_path / "folder").mkdir()
    into_folder = run("inspect", dataset, "--sample", 0, "--extract", tmp_path / "folder")
    assert into_folder.exit_code == 2 and "is a directory" in into_folder.output  # click's path check, first
    assert not any((tmp_path / "folder").iterdir())
    device = run("inspect", dataset, "--sample", 0, "--extract", "/dev/null", "--force")
    assert device.exit_code == 2
    assert "error: /dev/null: is not a regular file (a FIFO, device or socket); give a file name" in device.output
    missing = run("inspect", dataset, "--sample", 0, "--extract", tmp_path / "no" / "such" / "folder.jpg")
    assert missing.exit_code == 3
    assert f"error: {tmp_path / 'no' / 'such' / 'folder.jpg'}: cannot write: No such file or directory" in missing.output


def test_an_environment_failure_outside_the_library_checks_exits_3(dataset: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError no library check turned into a PackerError (EIO, EPIPE) is still one line, exit 3."""
    import errno

    import packer.verify

    def failing(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(packer.verify, "verify", failing)
    done = run("verify", dataset)
    assert done.exit_code == 3
    assert done.output.strip().splitlines()[-1] == "error: Input/output error"
    as_json = run("verify", dataset, "--json")
    assert as_json.exit_code == 3 and json.loads(as_json.stdout)["error"] == "OSError"
