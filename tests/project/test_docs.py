"""Every page of README.md and of the documentation (docs/**/*.md) runs top to bottom, as a reader runs it.

How a reader follows a page: a fresh home folder (``$HOME``, so ``~/...`` lands in it) with a
``packer`` command on ``PATH``, the sample data the pages read written by ``packer sample-data
~/data`` (what getting-started has a new user run first; a page that runs it itself, like
getting-started, is not given it twice), then the page's ```sh and ```python blocks, in page
order, in **one shell session** (``bash -e -o pipefail``): a ``cd`` or a variable of one block
holds in the next, a Python block is saved as a script and run with ``python`` from that shell,
and the first block that fails stops the page. Nothing in a block is rewritten; a block indented
inside a list item runs too (dedented). A page fails the test when a block exits non-zero or
prints a traceback; the failure names the block.

Markers, an HTML comment on the line(s) just before a block's opening fence:

* ``<!-- readme-test: gpu -->``: needs an NVIDIA GPU (CUDA); left out without one.
* ``<!-- readme-test: skip REASON -->``: not runnable here (a cluster scheduler, ssh to hosts, a
  cloud bucket); the reason is required and reported.

The pages of the framework integrations (``tests/integrations/test_guides.py``: Lightning,
Hugging Face, Grain, torchvision) run there, with their libraries, through the same session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from helpers import packer_on_path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
#: README.md, then every page of the site in path order (pages written by other tools are not here)
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
LANGUAGES = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
FENCE = re.compile(r"^( *)```\s*([A-Za-z]*)\s*$")
MARKER = re.compile(r"^<!--\s*readme-test:\s*(\w+)\s*(.*?)\s*-->\s*$")
TIMEOUT_S = 240


@dataclass(frozen=True)
class Block:
    page: str        # the file, relative to the repository
    line: int        # 1-based line of the opening fence
    language: str    # "python" or "sh"
    code: str
    marker: str      # "", "gpu" or "skip"
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page}:L{self.line}-{self.language}"


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The runnable blocks of a Markdown page, with their markers (see the module docstring)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent = len(opening.group(1))
        end = i + 1
        while end < len(lines) and not (FENCE.match(lines[end]) and not FENCE.match(lines[end]).group(2)):
            end += 1
        language = LANGUAGES.get(opening.group(2).lower())
        if language is not None:
            marker, reason = "", ""
            back = i - 1
            while back >= 0 and not lines[back].strip():
                back -= 1
            found = MARKER.match(lines[back].strip()) if back >= 0 else None
            if found:
                marker, reason = found.group(1), found.group(2)
            code = "\n".join(line[indent:] if line[:indent].isspace() else line for line in lines[i + 1:end])
            blocks.append(Block(page, i + 1, language, code + "\n", marker, reason))
        i = end + 1
    return blocks


def test_marker_parsing_is_strict() -> None:
    text = ("x\n<!-- readme-test: gpu -->\n\n```python\nprint(1)\n```\n"
            "```sh\necho hi\n```\n<!-- readme-test: skip needs Slurm -->\n```bash\nsbatch x\n```\n"
            "```\nnot code\n```\n- a list item:\n\n  ```python\n  if True:\n      print(2)\n  ```\n")
    blocks = readme_blocks(text, "page.md")
    assert [(b.line, b.language, b.marker, b.reason) for b in blocks] == [
        (4, "python", "gpu", ""), (7, "sh", "", ""), (11, "sh", "skip", "needs Slurm"), (19, "python", "", "")]
    assert blocks[0].code == "print(1)\n" and blocks[3].code == "if True:\n    print(2)\n"
    assert blocks[3].id == "page.md:L19-python"


def page_name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


BLOCKS = [block for page in PAGES for block in readme_blocks(page.read_text(encoding="utf-8"), page_name(page))]


def test_every_page_has_a_title_and_the_docs_have_blocks() -> None:
    """A page without runnable blocks is fine (a table, a reference); the docs as a whole are not."""
    for page in PAGES[1:]:
        first = page.read_text(encoding="utf-8").lstrip().splitlines()[0]
        assert first.startswith("# "), f"{page_name(page)} must start with one '# Title' line"
    assert sum(1 for block in BLOCKS if block.page.startswith("docs/") and not block.marker) >= 20


#: The pages tests/integrations/test_guides.py runs (each needs its framework's library).
INTEGRATION_PAGES = ("docs/guides/lightning.md", "docs/guides/huggingface.md", "docs/guides/grain-jax.md",
                     "docs/guides/torchvision-v2.md")
#: What a reader has run before any page: the sample data every page reads (``packer sample-data``).
SAMPLE_DATA = "packer sample-data ~/data"
_HOMES: dict[str, Path] = {}


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def session_script(blocks: list[Block], home: Path, *, gpu: bool, prelude: str = "",
                   runnable: "Callable[[Block], bool] | None" = None) -> tuple[str, list[str]]:
    """One bash script running ``blocks`` in page order (Python blocks saved beside it and run by
    ``python``), and the skips it leaves out with their reasons.

    Before each block the script writes ``### <page>:L<line>`` to stderr, so a failure names the
    block it stopped in. ``runnable(block)``, when given, decides for ``skip`` blocks (the
    torchvision page runs its ``needs torchvision`` blocks in that venv).
    """
    lines, skipped = ["set -e -o pipefail", prelude], []
    for block in blocks:
        where = f"{block.page} line {block.line}"
        if block.marker == "skip" and not (runnable and runnable(block)):
            assert block.reason, f"{where}: a skipped block must say why (readme-test: skip REASON)"
            skipped.append(f"{where}: {block.reason}")
            continue
        assert block.marker in ("", "gpu", "skip"), f"{where}: unknown marker readme-test: {block.marker}"
        if block.marker == "gpu" and not gpu:
            skipped.append(f"{where}: needs a CUDA GPU")
            continue
        lines.append(f"echo '### {block.page}:L{block.line}' >&2")
        if block.language == "python":
            script = home / f"block_{re.sub(r'[^A-Za-z0-9]', '_', block.page)}_{block.line}.py"
            script.write_text(block.code)
            lines.append(f"python {script}")
        else:
            lines.append(block.code)
    return "\n".join(lines) + "\n", skipped


def run_session(page: str, blocks: list[Block], home: Path, *, prelude: str = "", timeout: float = 840,
                runnable: "Callable[[Block], bool] | None" = None) -> list[str]:
    """Run ``blocks`` of ``page`` in one shell session in ``home`` (``packer`` and this checkout's
    Python on ``PATH``); fails naming the block that failed. Returns the skipped blocks."""
    env = packer_on_path(home)
    # after packer, this interpreter's own commands (python, torchrun, moto_server), as in an activated venv
    bin_dir, rest = env["PATH"].split(os.pathsep, 1)
    env["PATH"] = os.pathsep.join([bin_dir, str(Path(sys.executable).parent), rest])
    script, skipped = session_script(blocks, home, gpu=_has_cuda(), prelude=prelude, runnable=runnable)
    (home / "session.sh").write_text(script)
    done = subprocess.run(["bash", str(home / "session.sh")], cwd=home, env=env, capture_output=True, text=True,
                          timeout=timeout)
    markers = re.findall(r"^### (\S+)$", done.stderr, re.MULTILINE)
    where = markers[-1] if markers else f"{page} (before its first block)"
    output = (done.stdout[-3000:] + "\n" + done.stderr[-4000:]).strip()
    assert done.returncode == 0, f"{where} exited {done.returncode} (the page runs top to bottom):\n{output}"
    assert "Traceback (most recent call last)" not in done.stderr, f"{where}:\n{output}"
    # the docs show the current spelling: no deprecated reader keyword (shown: the warning names __main__)
    assert "is deprecated and goes in the next release" not in done.stderr, f"{where}:\n{output}"
    return skipped


SESSION_PAGES = [page for page in PAGES if page_name(page) not in INTEGRATION_PAGES]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", SESSION_PAGES, ids=[page_name(page) for page in SESSION_PAGES])
def test_page_runs_top_to_bottom(page: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    name = page_name(page)
    blocks = [block for block in BLOCKS if block.page == name]
    if not any(block.marker != "skip" for block in blocks):
        pytest.skip(f"{name} has no runnable block")
    home = tmp_path_factory.mktemp(re.sub(r"\W", "_", name))
    _HOMES[name] = home
    runs_it = any(SAMPLE_DATA in block.code for block in blocks if not block.marker)
    run_session(name, blocks, home, prelude="" if runs_it else SAMPLE_DATA + " >/dev/null 2>&1")


#: The page whose blocks build train and val splits with one class list (its comments promise it).
SPLITS_PAGE = "docs/guides/imagenet-folders.md"


def test_split_claims_hold_after_the_blocks_ran() -> None:
    """What the splits guide's comments promise about the outputs its blocks made (run after them)."""
    from packer.classes import check_classes

    if SPLITS_PAGE not in _HOMES:
        pytest.skip(f"the blocks of {SPLITS_PAGE} did not run (deselected)")
    home = _HOMES[SPLITS_PAGE]
    train, val = home / "packed" / "train", home / "packed" / "val"
    assert (train / "manifest.json").is_file() and (val / "manifest.json").is_file(), \
        f"{SPLITS_PAGE} no longer builds packed/train and packed/val"
    check_classes(train, val)  # "same labels in every split", though val lacks a class


def test_site_hooks_rewrite_links_and_list_new_pages(tmp_path: Path) -> None:
    """scripts/docs_hooks.py: links of generated pages point at site pages, new guides join the nav."""
    pytest.importorskip("mkdocs")
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import docs_hooks
    finally:
        sys.path.remove(str(REPO / "scripts"))
    readme = ("[a](docs/guides/gpu.md#x) [spec](formats/SPEC.md) ![s](docs/images/report.png) "
              "[l](LICENSE) [`tool`](scripts/check_dist.py) [w](https://example.org/a.md) [t](#top)")
    assert docs_hooks.rewrite_links(readme, "README.md", "index.md") == (
        "[a](guides/gpu.md#x) [spec](reference/spec.md) ![s](images/report.png) "
        "`l` `tool` [w](https://example.org/a.md) [t](#top)")
    assert docs_hooks.rewrite_links("[r](../README.md) [c](../CHANGELOG.md)", "formats/SPEC.md",
                                    "reference/spec.md") == "[r](../index.md) [c](../changelog.md)"
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "reference").mkdir()
    for name in ("listed.md", "new-guide.md"):
        (docs / "guides" / name).write_text(f"# {name}\n")
    (docs / "reference" / "new-ref.md").write_text("# new\n")
    config = {"docs_dir": str(docs), "nav": [{"Home": "index.md"}, {"Build": ["guides/listed.md"]},
                                             {"Reference": ["reference/cli.md"]}]}
    docs_hooks.on_config(config)
    assert config["nav"] == [{"Home": "index.md"}, {"Build": ["guides/listed.md"]},
                             {"More guides": ["guides/new-guide.md"]},
                             {"Reference": ["reference/cli.md", "reference/new-ref.md"]}]
