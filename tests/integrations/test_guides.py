"""The integration guides run as written: every ```python / ```sh block of each page, in page
order, in a fresh working folder with ``packer`` on PATH (the README test's rules and markers:
``tests/project/test_docs.py``).

The torchvision page runs under ``make test-torchvision`` (torchvision does not import beside the
main venv's torch): its blocks are marked ``skip needs torchvision...`` for the main docs run,
and run here, in the torchvision venv.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import packer_on_path

REPO = Path(__file__).resolve().parents[2]
GUIDES = REPO / "docs" / "guides"
TORCHVISION_SKIP = "needs torchvision"
_spec = importlib.util.spec_from_file_location("_readme_blocks", REPO / "tests" / "project" / "test_docs.py")
_readme = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _readme  # its dataclass looks its module up there
_spec.loader.exec_module(_readme)  # type: ignore[union-attr]

PAGES = {"lightning.md": "lightning", "huggingface.md": "datasets", "grain-jax.md": "grain",
         "torchvision-v2.md": "torchvision"}


def _run_page(page: str, home: Path) -> None:
    blocks = _readme.readme_blocks((GUIDES / page).read_text(encoding="utf-8"))
    assert blocks, f"{page} has no code blocks"
    env = packer_on_path(home)
    ran = 0
    for block in blocks:
        if block.marker == "skip":
            assert block.reason, f"{page} line {block.line}: a skipped block must say why"
            if not (page == "torchvision-v2.md" and block.reason.startswith(TORCHVISION_SKIP)):
                continue
        assert block.marker in ("", "skip"), f"{page} line {block.line}: marker {block.marker}"
        if block.language == "python":
            script = home / f"block_{block.line}.py"
            script.write_text(block.code)
            command = [sys.executable, str(script)]
        else:
            command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
        done = subprocess.run(command, cwd=home, env=env, capture_output=True, text=True, timeout=300)
        output = (done.stdout[-3000:] + "\n" + done.stderr[-3000:]).strip()
        assert done.returncode == 0, f"{page} line {block.line} ({block.language}) exited {done.returncode}:\n{output}"
        assert "Traceback (most recent call last)" not in done.stderr, f"{page} line {block.line}:\n{output}"
        ran += 1
    assert ran, f"{page}: no block ran"


@pytest.mark.parametrize("page", [p for p in PAGES if p != "torchvision-v2.md"])
def test_guide_runs(page: str, tmp_path: Path) -> None:
    pytest.importorskip(PAGES[page], reason=f"the {page} guide needs {PAGES[page]}")
    _run_page(page, tmp_path)


@pytest.mark.torchvision
def test_torchvision_guide_runs(tmp_path: Path) -> None:
    pytest.importorskip("torchvision", reason="the torchvision guide runs under make test-torchvision")
    _run_page("torchvision-v2.md", tmp_path)


def test_every_guide_has_one_title_and_its_tested_versions() -> None:
    for page in PAGES:
        text = (GUIDES / page).read_text(encoding="utf-8")
        titles, in_code = [], False
        for line in text.splitlines():
            in_code ^= line.startswith("```")
            if not in_code and line.startswith("# "):
                titles.append(line)
        assert len(titles) == 1, f"{page}: {titles}"
        assert "Tested with" in text, f"{page} says which versions were tested"
