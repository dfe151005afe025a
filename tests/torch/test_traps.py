"""Ordinary ways of using packer that used to give a wrong or failed run without a clear error (#12 §3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer import format as fmt
from packer.writer import build
from packer.writer.plan import BuildOptions
from packer.cli import _register, cli
from packer.dataset import open_dataset
from packer.errors import EmptySourceError, NotAPackerFileError, OptionError

_register()


def write_images(root: Path, classes: dict[str, int], *, height: int = 20, width: int = 30) -> None:
    rng = np.random.default_rng(1)
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(
                root / name / f"{i:03d}.png")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    write_images(tmp_path / "src", {"cat": 3, "dog": 2})
    return tmp_path / "src"


# --- --resume after success ------------------------------------------------------------------

def test_resume_on_a_finished_dataset_is_complete_not_an_error(source: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "out"
    assert runner.invoke(cli, ["build", str(source), str(out), "-q"]).exit_code == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = runner.invoke(cli, ["build", str(source), str(out), "-q", "--resume"])
    assert again.exit_code == 0, again.output
    assert "already complete" in again.output and "nothing to do" in again.output
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # nothing rewritten

    other_options = runner.invoke(cli, ["build", str(source), str(out), "-q", "--resume", "--seed", "7"])
    assert other_options.exit_code == 3 and "seed: built 0, asked 7" in other_options.output
    write_images(tmp_path / "other", {"cat": 1})
    other_source = runner.invoke(cli, ["build", str(tmp_path / "other"), str(out), "-q", "--resume"])
    assert other_source.exit_code == 3 and "different source" in other_source.output


# --- builds that pack nothing ------------------------------------------------------------------

def test_manifest_without_usable_rows_writes_the_report_and_leaves_no_half_build(source: Path,
                                                                                 tmp_path: Path) -> None:
    manifest = tmp_path / "metadata.jsonl"  # HuggingFace imagefolder style
    manifest.write_text("".join(json.dumps({"file_name": f"cat/{i:03d}.png", "label": 0}) + "\n"
                                for i in range(3)))
    out = tmp_path / "out"
    with pytest.raises(EmptySourceError) as caught:
        build(manifest, out, BuildOptions(), root=source, workers=1)
    message = str(caught.value)
    assert "3 rejected: 3 bad-manifest-row" in message and "rename column 'file_name' to 'path'" in message
    assert "build-report.jsonl" in message
    assert sorted(p.name for p in out.iterdir()) == [fmt.REPORT_NAME]  # no staging, no lock
    lines = [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text().splitlines()]
    assert lines[0]["type"] == "summary" and lines[0]["packed"] == 0
    assert [line["key"] for line in lines[1:]] == ["metadata.jsonl:1", "metadata.jsonl:2", "metadata.jsonl:3"]
    with pytest.raises(NotAPackerFileError, match="packed nothing"):
        open_dataset(out)


def test_bad_csv_header_leaves_no_output_folder(source: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "list.csv"
    manifest.write_text("path, label\ncat/000.png,0\n")
    result = CliRunner().invoke(cli, ["build", str(manifest), str(tmp_path / "out"), "--root", str(source)])
    assert result.exit_code == 2 and "' label' has spaces" in result.output
    assert not (tmp_path / "out").exists()


def test_every_file_rejected_while_packing_keeps_the_names(tmp_path: Path) -> None:
    (tmp_path / "src" / "cat").mkdir(parents=True)
    for i in range(3):
        (tmp_path / "src" / "cat" / f"{i}.jpg").write_text("not an image")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["build", str(tmp_path / "src"), str(out), "-q"])
    assert result.exit_code == 2 and "3 not-an-image" in result.output
    assert not (out / ".packer-build").exists() and not (out / ".packer.lock").exists()
    report = (out / fmt.REPORT_NAME).read_text()
    assert all(f"cat/{i}.jpg" in report for i in range(3))
    inspect = CliRunner().invoke(cli, ["inspect", str(out)])
    assert "--resume" not in inspect.output and "packed nothing" in inspect.output


# --- one size order ------------------------------------------------------------------------------

def test_raw_size_and_inspect_use_one_order(source: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "raw"
    result = runner.invoke(cli, ["build", str(source), str(out), "-q", "--codec", "raw", "--size", "16x24"])
    assert result.exit_code == 0, result.output
    with open_dataset(out) as ds:
        assert (int(ds.index.height[0]), int(ds.index.width[0])) == (16, 24)
    sample = runner.invoke(cli, ["inspect", str(out), "--sample", "0"])
    assert "16x24 (HxW)" in sample.output
    help_text = runner.invoke(cli, ["build", "--help"]).output
    assert "HEIGHTxWIDTH" in help_text and "like inspect prints" in " ".join(help_text.split())


# --- torch habits ----------------------------------------------------------------------------------

def test_normalize_on_gpu_accepts_chw_and_hwc_batches() -> None:
    torch = pytest.importorskip("torch")
    from packer.transforms import normalize_on_gpu

    hwc = torch.from_numpy(np.random.default_rng(0).integers(0, 255, (2, 5, 7, 3), dtype=np.uint8))
    chw = hwc.permute(0, 3, 1, 2).contiguous()
    a = normalize_on_gpu(hwc, device="cpu")
    b = normalize_on_gpu(chw, device="cpu")
    assert a.shape == b.shape == (2, 3, 5, 7) and torch.equal(a, b)
    with pytest.raises(OptionError, match="layout="):
        normalize_on_gpu(torch.zeros((2, 3, 4, 3), dtype=torch.uint8), device="cpu")
    ambiguous = torch.zeros((2, 3, 4, 3), dtype=torch.uint8)
    assert normalize_on_gpu(ambiguous, device="cpu", layout="NCHW").shape == (2, 3, 4, 3)
    assert normalize_on_gpu(ambiguous, device="cpu", layout="NHWC").shape == (2, 3, 3, 4)


def test_decode_transform_passed_as_transform_says_pass_it_as_decode(source: Path, tmp_path: Path) -> None:
    torch_mod = pytest.importorskip("packer.torch")
    from packer.transforms import CenterCrop, RandomResizedCrop

    build(source, tmp_path / "ds", BuildOptions(), workers=1)
    for crop in (RandomResizedCrop(8), CenterCrop(8)):
        with pytest.raises(OptionError, match="pass it as decode="):
            torch_mod.PackedDataset(tmp_path / "ds", transform=crop)
    ok = torch_mod.PackedDataset(tmp_path / "ds", decode=RandomResizedCrop(8))
    assert tuple(ok[0][0].shape) == (3, 8, 8)


def test_fields_carry_key_index_and_metadata_through_a_dataloader(source: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch_mod = pytest.importorskip("packer.torch")
    manifest = tmp_path / "list.jsonl"
    files = sorted(p.relative_to(source).as_posix() for p in source.rglob("*.png"))
    manifest.write_text("".join(json.dumps({"path": f, "label": f.split("/")[0], "metadata": {"n": n}}) + "\n"
                                for n, f in enumerate(files)))
    build(manifest, tmp_path / "ds", BuildOptions(), root=source, workers=1)
    ds = torch_mod.PackedDataset(tmp_path / "ds", fields=("image", "label", "key", "index", "metadata"))
    with pytest.raises(OptionError, match="fields"):
        torch_mod.PackedDataset(tmp_path / "ds", fields=("image", "caption"))
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=torch_mod.collate)
    seen = []
    for batch in loader:
        assert set(batch) == {"image", "label", "key", "index", "metadata"}
        assert batch["image"].shape[1:] == (3, 20, 30) and batch["label"].dtype == torch.int64
        for key, index, meta, label in zip(batch["key"], batch["index"].tolist(), batch["metadata"],
                                           batch["label"].tolist()):
            assert ds.dataset.key(index) == key and meta == {"n": files.index(key)}
            assert ds.classes[label] == key.split("/")[0]
            seen.append(key)
    assert sorted(seen) == files
    default = ds.dataset  # the default stays (image, label)
    image, label = torch_mod.PackedDataset(default)[0]
    assert isinstance(label, int) and image.dtype == torch.uint8


# --- quiet library, talkative CLI ---------------------------------------------------------------

def test_library_calls_print_nothing_by_default(source: Path, tmp_path: Path, capfd) -> None:
    from packer.verify import verify

    build(source, tmp_path / "ds", BuildOptions(), workers=1)
    verify(tmp_path / "ds")
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_cli_verbose_logs_the_steps_and_quiet_keeps_warnings(tmp_path: Path) -> None:
    write_images(tmp_path / "data" / "train", {"cat": 1})
    write_images(tmp_path / "data" / "val", {"cat": 1})
    runner = CliRunner()
    verbose = runner.invoke(cli, ["build", str(tmp_path / "data" / "train"), str(tmp_path / "a"), "-v"])
    assert verbose.exit_code == 0 and "INFO: planned 1 shard(s)" in verbose.output
    quiet = runner.invoke(cli, ["build", str(tmp_path / "data"), str(tmp_path / "b"), "-q"])
    assert quiet.exit_code == 0 and "INFO" not in quiet.output and "look like dataset splits" in quiet.output


def test_cli_logging_setup_is_undone_after_the_command(source: Path, tmp_path: Path) -> None:
    import logging

    logger = logging.getLogger("packer")
    before = (list(logger.handlers), logger.level, logger.propagate)
    result = CliRunner().invoke(cli, ["build", str(source), str(tmp_path / "out"), "-q", "-v"])
    assert result.exit_code == 0
    assert (list(logger.handlers), logger.level, logger.propagate) == before
