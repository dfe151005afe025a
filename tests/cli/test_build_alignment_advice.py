"""``packer build`` advises the default ``--alignment auto`` when an explicit 4 KiB alignment pads small records
(benchmarks/bench_alignment.py measured what it costs the readers), and only then."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner
from PIL import Image

import packer.cli.build_cmd  # noqa: F401  (registers the command)
from packer.cli import cli


def _folder(root: Path, size: int, count: int = 12) -> Path:
    rng = np.random.default_rng(size)
    for i in range(count):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(root / f"c{i % 2}" / f"{i}.png")
    return root


def _advice(*args: str) -> list[str]:
    done = CliRunner().invoke(cli, ["build", *args, "--quiet", "--workers", "1"])
    assert done.exit_code == 0, done.output
    return [line for line in done.output.splitlines() if line.startswith("alignment:")]


def test_small_raw_records_get_the_alignment_advice(tmp_path: Path, monkeypatch) -> None:
    source = _folder(tmp_path / "png32", 32)
    paged = ("--alignment", "4096")
    assert _advice(str(source), str(tmp_path / "tiny"), "--codec", "raw", "--size", "32x32", *paged) == []  # kilobytes
    monkeypatch.setattr(packer.cli.build_cmd, "PADDING_ADVICE_MIN_BYTES", 0)  # as if it held 50,000 of them
    (line,) = _advice(str(source), str(tmp_path / "raw"), "--codec", "raw", "--size", "32x32", *paged)
    assert "every sample starts on a 4,096-byte boundary; a sample holds 3,072 bytes on average" in line
    assert "Without --alignment (the default, auto) these samples would be packed at 64 bytes" in line
    assert "page blocks" in line and "GPUDirect" in line
    assert _advice(str(source), str(tmp_path / "raw64"), "--codec", "raw", "--size", "32x32", "--alignment", "64") == []
    assert _advice(str(source), str(tmp_path / "auto"), "--codec", "raw", "--size", "32x32") == []  # auto chose 64
    assert _advice(str(source), str(tmp_path / "png"), *paged)  # 3 KB PNGs passed through: padded too


def test_large_records_get_no_alignment_advice(tmp_path: Path) -> None:
    source = _folder(tmp_path / "png160", 160, count=4)  # ~77 KB each: the padding is a few per cent
    assert _advice(str(source), str(tmp_path / "out")) == []
