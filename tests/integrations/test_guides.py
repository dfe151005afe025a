"""The integration guides run as written: each page top to bottom, its ```python / ```sh blocks in
page order in one shell session, in a fresh working folder with ``packer`` on PATH (the docs
test's rules, markers and session: ``tests/project/test_docs.py``).

The torchvision page runs under ``make test-torchvision`` (torchvision does not import beside the
main venv's torch): its blocks are marked ``skip needs torchvision...`` for the main docs run,
and run here, in the torchvision venv.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


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
    """The page top to bottom in one shell session (``test_docs.run_session``); on the torchvision
    page its ``skip needs torchvision`` blocks run too (this is the venv that has torchvision)."""
    name = f"docs/guides/{page}"
    blocks = _readme.readme_blocks((GUIDES / page).read_text(encoding="utf-8"), name)
    assert blocks, f"{page} has no code blocks"
    ran = [block for block in blocks if block.marker != "skip"
           or (page == "torchvision-v2.md" and block.reason.startswith(TORCHVISION_SKIP))]
    assert ran, f"{page}: no block runs"
    _readme.run_session(name, blocks, home, runnable=lambda block: page == "torchvision-v2.md"
                        and block.reason.startswith(TORCHVISION_SKIP))


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
