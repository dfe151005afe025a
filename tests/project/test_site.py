"""The built documentation site (``make docs``: ``mkdocs build --strict``), read as a visitor reads it.

The site is built once for the module into a temporary folder. The command reference is opened in
headless Chromium (``tests/helpers.py::run_chromium``): what the browser shows must hold no
``Sentinel`` (click 8.3's unset default, which mkdocs-click 0.9 printed for every flag) and no
summary cut mid-sentence (mkdocs-click lists each command by the first *line* of its help).
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import run_chromium

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs_click", reason="the site needs the docs extra (make docs)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def page_errors(console: list[str]) -> list[str]:
    """Console messages but the search's: Material loads its search index with a worker, which a
    page opened from the file system may not start (the site served by ``make docs-serve`` does)."""
    return [line for line in console if "search" not in line.lower()]


def visible_text(dom: str) -> str:
    """The text of a DOM as a reader sees it: no scripts, styles or tags, entities resolved."""
    body = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", dom)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def test_the_command_reference_shows_no_sentinel_and_no_cut_sentence(site: Path, tmp_path: Path) -> None:
    from packer.cli import COMMANDS

    page = site / "reference" / "cli.html"
    dom, console = run_chromium(page, tmp_path / "profile-dom", "--dump-dom")
    assert page_errors(console) == []
    text = visible_text(dom)
    assert "Sentinel" not in text and "UNSET" not in text
    article = dom[dom.index("<article"):dom.index("</article>")]
    listed = dict(re.findall(r"<li><em><a href=\"#packer-[a-z-]+\">([a-z-]+)</a></em>:\s*(.*?)</li>", article, re.S))
    assert set(listed) == set(COMMANDS), listed
    for name, summary in listed.items():
        summary = " ".join(visible_text(summary).split())
        assert summary == COMMANDS[name][1], (name, summary)  # the whole first paragraph of the help
        assert summary.endswith("."), f"{name}'s summary is cut: {summary!r}"
    # every flag's default cell says False, like `--help` reads it (a boolean flag is off unless given)
    rows = [[" ".join(visible_text(cell).split()) for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", article, re.S)]
    flags = [cells for cells in rows if len(cells) == 4 and cells[1] == "boolean"]
    assert len(flags) > 10 and all(cells[3] == "False" for cells in flags), flags
    shot = tmp_path / "cli.png"
    _, console = run_chromium(page, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1200,1600",
                              "--hide-scrollbars")
    assert page_errors(console) == []
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape == (1600, 1200, 3) and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # drawn


def _nav_after_hooks() -> list:
    import yaml

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import docs_hooks
    finally:
        sys.path.remove(str(REPO / "scripts"))
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text("utf-8"))
    config["docs_dir"] = str(REPO / "docs")
    docs_hooks.on_config(config)
    return config["nav"]


def _pages(items: object) -> list[str]:
    if isinstance(items, str):
        return [items]
    if isinstance(items, list):
        return [page for item in items for page in _pages(item)]
    if isinstance(items, dict):
        return [page for value in items.values() for page in _pages(value)]
    return []


def test_the_nav_groups_the_guides_lists_every_page_and_keeps_history_under_development() -> None:
    pytest.importorskip("mkdocs")
    nav = _nav_after_hooks()
    sections = {title: _pages(items) for entry in nav for title, items in entry.items()}
    pages = set(_pages(nav))
    on_disk = {path.relative_to(REPO / "docs").as_posix() for path in (REPO / "docs").rglob("*.md")}
    assert on_disk <= pages, f"pages left out of the nav: {sorted(on_disk - pages)}"
    assert {"Build", "Train", "Integrations", "Operate"} <= set(sections), list(sections)
    assert "Guides" not in sections and "More guides" not in sections  # every guide has its group
    assert all(page.startswith("guides/") for title in ("Build", "Train", "Integrations", "Operate")
               for page in sections[title])
    assert sections["Development"] == ["development.md", "design-notes.md", "performance-history.md"]
    assert "coming-from.md" in sections[next(t for t in sections if t.startswith("Coming from"))]
    performance = (REPO / "docs" / "performance.md").read_text("utf-8")
    assert "## Speed, round" not in performance  # the rounds of past work live in the history page


def test_no_code_comment_runs_past_the_code_box() -> None:
    """A code block's line longer than the box scrolls sideways on the site; where a comment makes
    it so, the comment goes on a line of its own or says less (110 columns fit)."""
    fence = re.compile(r"^( *)```\s*([A-Za-z]*)\s*$")
    long: list[str] = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        in_code, language = False, ""
        for number, line in enumerate(page.read_text("utf-8").splitlines(), 1):
            opening = fence.match(line)
            if opening:
                in_code, language = (True, opening.group(2).lower()) if not in_code else (bool(opening.group(2)), "")
                continue
            if in_code and language in ("python", "sh", "bash") and len(line) > 110 and "  # " in line:
                long.append(f"{page.relative_to(REPO)}:{number} ({len(line)} columns)")
    assert not long, long
