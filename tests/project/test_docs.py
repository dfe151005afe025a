"""Every ```python and ```sh block of README.md and of the documentation (docs/**/*.md) runs, as written.

How a reader would follow a page: one working folder per page (also ``$HOME``, so ``~/...``
paths land in it) holding what the examples name (``SRC``, ``NEW_SRC``, ``list.csv``,
``~/data/imagenet/train``, ``~/data/cifar/train``, ``~/images``, ...), a ``packer`` command on
``PATH``, and the page's blocks run in page order (a later block may use what an earlier one of
the same page built, like ``packed/train``; pages do not share folders). Nothing in a block is
rewritten; a block indented inside a list item runs too (dedented). A block fails the test when
it raises, exits non-zero or prints a traceback.

Markers, an HTML comment on the line(s) just before a block's opening fence:

* ``<!-- readme-test: gpu -->``: needs an NVIDIA GPU (CUDA); skipped without one.
* ``<!-- readme-test: skip REASON -->``: not runnable here (a cluster scheduler, ssh to
  hosts); the reason is required and shown in the skip.

Shell blocks run with ``bash -e -o pipefail``; Python blocks as a script file.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

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


def _write_images(root: Path, names: dict[str, list[str]], seed: int,
                  size: tuple[int, int] | None = None) -> None:
    rng = np.random.default_rng(seed)
    for label, files in names.items():
        (root / label).mkdir(parents=True, exist_ok=True)
        for name in files:
            shape = size or (40 + rng.integers(0, 24), 48 + rng.integers(0, 24))
            pixels = rng.integers(0, 255, (*shape, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / name, quality=85)


def _write_coco(root: Path) -> None:
    """A COCO detection source: ``images/`` and ``instances.json`` (0 to 3 boxes per image)."""
    (root / "images").mkdir(parents=True)
    coco: dict[str, list] = {"images": [], "annotations": [],
                             "categories": [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}]}
    rng = np.random.default_rng(4)
    for i in range(8):
        name = f"{i:012d}.jpg"
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(root / "images" / name)
        coco["images"].append({"id": i, "file_name": name, "width": 64, "height": 48})
        for k in range(i % 4):
            coco["annotations"].append({"id": 10 * i + k, "image_id": i, "category_id": (1, 18)[k % 2],
                                        "bbox": [4.0 + 8 * k, 6.0, 20.0, 30.0], "iscrowd": 0})
    (root / "instances.json").write_text(json.dumps(coco))


_WORLDS: dict[str, dict[str, object]] = {}


@pytest.fixture
def world(request, tmp_path_factory) -> dict[str, object]:
    """The reader's working folder (and $HOME) for the block's page, made on its first block."""
    page = request.node.callspec.params["block"].page if hasattr(request.node, "callspec") else "README.md"
    if page not in _WORLDS:
        _WORLDS[page] = make_world(tmp_path_factory.mktemp(re.sub(r"\W", "_", page)))
    return _WORLDS[page]


def make_world(home: Path) -> dict[str, object]:
    """A folder with every input the pages name."""
    classes = {"cat": [f"{i:03d}.jpg" for i in range(24)], "dog": [f"{i:03d}.jpg" for i in range(24)]}
    _write_images(home / "data" / "imagenet" / "train", classes, seed=0)
    _write_images(home / "data" / "imagenet" / "val", {"dog": ["000.jpg", "001.jpg"]}, seed=2)  # lacks cat
    shutil.copytree(home / "data" / "imagenet" / "train", home / "SRC")
    shutil.copytree(home / "data" / "imagenet" / "train", home / "images")
    _write_images(home / "NEW_SRC", {"cat": ["100.jpg", "101.jpg"], "emu": ["000.jpg"]}, seed=1)
    _write_coco(home / "coco")
    cifar = {label: [f"{i:03d}.png" for i in range(40)] for label in ("airplane", "frog")}
    _write_images(home / "data" / "cifar" / "train", cifar, seed=3, size=(32, 32))
    files = [f"{label}/{name}" for label, names in classes.items() for name in names]
    (home / "list.csv").write_text("path,label,caption\n" + "".join(f"{f},{f.split('/')[0]},a photo\n"
                                                                    for f in files))
    (home / "list.jsonl").write_text("".join(json.dumps({"path": f"images/{f}", "label": f.split("/")[0],
                                                         "metadata": {"n": n}}) + "\n"
                                             for n, f in enumerate(files)))
    env = packer_on_path(home)
    return {"home": home, "env": env}


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block_runs(block: Block, world: dict[str, object]) -> None:
    where = f"{block.page} line {block.line}"
    if block.marker == "skip":
        assert block.reason, f"{where}: a skipped block must say why (readme-test: skip REASON)"
        pytest.skip(f"{where}: {block.reason}")
    assert block.marker in ("", "gpu"), f"{where}: unknown marker readme-test: {block.marker}"
    if block.marker == "gpu" and not _has_cuda():
        pytest.skip(f"{where}: needs a CUDA GPU")
    home = world["home"]
    assert isinstance(home, Path)
    if block.language == "python":
        script = home / f"block_{re.sub(r'[^A-Za-z0-9]', '_', block.page)}_{block.line}.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    done = subprocess.run(command, cwd=home, env=world["env"], capture_output=True, text=True, timeout=TIMEOUT_S)
    output = (done.stdout[-3000:] + "\n" + done.stderr[-3000:]).strip()
    assert done.returncode == 0, f"{where} ({block.language}) exited {done.returncode}:\n{output}"
    assert "Traceback (most recent call last)" not in done.stderr, f"{where}:\n{output}"
    # the docs show the current spelling: no deprecated reader keyword (shown: the warning names __main__)
    assert "is deprecated and goes in the next release" not in done.stderr, f"{where}:\n{output}"


#: The page whose blocks build train and val splits with one class list (its comments promise it).
SPLITS_PAGE = "docs/guides/imagenet-folders.md"


def test_split_claims_hold_after_the_blocks_ran() -> None:
    """What the splits guide's comments promise about the outputs its blocks made (run after them)."""
    from packer.classes import check_classes

    if SPLITS_PAGE not in _WORLDS:
        pytest.skip(f"the blocks of {SPLITS_PAGE} did not run (deselected)")
    home = _WORLDS[SPLITS_PAGE]["home"]
    assert isinstance(home, Path)
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
    for name in ("listed.md", "new-guide.md"):
        (docs / "guides" / name).write_text(f"# {name}\n")
    config = {"docs_dir": str(docs), "nav": [{"Home": "index.md"}, {"Guides": ["guides/listed.md"]}]}
    docs_hooks.on_config(config)
    assert config["nav"][1] == {"Guides": ["guides/listed.md", "guides/new-guide.md"]}
