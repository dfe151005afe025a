"""`make demo` (scripts/demo.py), the README's first quickstart command, runs end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--out", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "OK: 96 of 96 samples" in done.stdout
    assert "batch: images (16, 3, 64, 64) torch.uint8" in done.stdout
    assert (tmp_path / "demo" / "contact-sheet.png").stat().st_size > 0
    from packer.codecs.tiles import transcoder_available
    if transcoder_available():
        assert "random crops identical between dataset and dataset-tiled: 96 of 96" in done.stdout
