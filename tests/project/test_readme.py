"""Every ```python and ```sh block of README.md runs, as written, against a small dataset.

How a reader would follow the README: one working folder (also ``$HOME``, so ``~/...`` paths
land in it) holding what the examples name (``SRC``, ``NEW_SRC``, ``list.csv``,
``~/data/imagenet/train``, ``~/images``, ...), a ``packer`` command on ``PATH``, and the blocks
run in README order (a later block may use what an earlier one built, like ``packed/train``).
Nothing in a block is rewritten. A block fails the test when it raises, exits non-zero or
prints a traceback.

Markers, an HTML comment on the line(s) just before a block's opening fence:

* ``<!-- readme-test: gpu -->``: needs an NVIDIA GPU (CUDA); skipped without one.
* ``<!-- readme-test: skip REASON -->``: not runnable here (a cluster scheduler, ssh to
  hosts); the reason is required and shown in the skip.

Shell blocks run with ``bash -e -o pipefail``; Python blocks as a script file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
LANGUAGES = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
FENCE = re.compile(r"^```\s*([A-Za-z]*)\s*$")
MARKER = re.compile(r"^<!--\s*readme-test:\s*(\w+)\s*(.*?)\s*-->\s*$")
TIMEOUT_S = 240


@dataclass(frozen=True)
class Block:
    line: int        # 1-based line of the opening fence
    language: str    # "python" or "sh"
    code: str
    marker: str      # "", "gpu" or "skip"
    reason: str

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.language}"


def readme_blocks(text: str) -> list[Block]:
    """The runnable blocks of a README, with their markers (see the module docstring)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        language = LANGUAGES.get(opening.group(1).lower())
        if language is not None:
            marker, reason = "", ""
            back = i - 1
            while back >= 0 and not lines[back].strip():
                back -= 1
            found = MARKER.match(lines[back].strip()) if back >= 0 else None
            if found:
                marker, reason = found.group(1), found.group(2)
            blocks.append(Block(i + 1, language, "\n".join(lines[i + 1:end]) + "\n", marker, reason))
        i = end + 1
    return blocks


def test_marker_parsing_is_strict() -> None:
    text = ("x\n<!-- readme-test: gpu -->\n\n```python\nprint(1)\n```\n"
            "```sh\necho hi\n```\n<!-- readme-test: skip needs Slurm -->\n```bash\nsbatch x\n```\n"
            "```\nnot code\n```\n")
    blocks = readme_blocks(text)
    assert [(b.line, b.language, b.marker, b.reason) for b in blocks] == [
        (4, "python", "gpu", ""), (7, "sh", "", ""), (11, "sh", "skip", "needs Slurm")]
    assert blocks[0].code == "print(1)\n"


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def _write_images(root: Path, names: dict[str, list[str]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for label, files in names.items():
        (root / label).mkdir(parents=True, exist_ok=True)
        for name in files:
            pixels = rng.integers(0, 255, (40 + rng.integers(0, 24), 48 + rng.integers(0, 24), 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / name, quality=85)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, object]:
    """The reader's working folder (and $HOME) with every input the README names."""
    home = tmp_path_factory.mktemp("readme")
    classes = {"cat": [f"{i:03d}.jpg" for i in range(24)], "dog": [f"{i:03d}.jpg" for i in range(24)]}
    _write_images(home / "data" / "imagenet" / "train", classes, seed=0)
    _write_images(home / "data" / "imagenet" / "val", {"dog": ["000.jpg", "001.jpg"]}, seed=2)  # lacks cat
    shutil.copytree(home / "data" / "imagenet" / "train", home / "SRC")
    shutil.copytree(home / "data" / "imagenet" / "train", home / "images")
    _write_images(home / "NEW_SRC", {"cat": ["100.jpg", "101.jpg"], "emu": ["000.jpg"]}, seed=1)
    files = [f"{label}/{name}" for label, names in classes.items() for name in names]
    (home / "list.csv").write_text("path,label,caption\n" + "".join(f"{f},{f.split('/')[0]},a photo\n"
                                                                    for f in files))
    (home / "list.jsonl").write_text("".join(json.dumps({"path": f"images/{f}", "label": f.split("/")[0],
                                                         "metadata": {"n": n}}) + "\n"
                                             for n, f in enumerate(files)))
    bin_dir = home / "bin"
    bin_dir.mkdir()
    (bin_dir / "packer").write_text(f"#!/bin/sh\nexec {sys.executable} -m packer \"$@\"\n")
    (bin_dir / "packer").chmod(0o755)
    env = dict(os.environ)
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")])))
    return {"home": home, "env": env}


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block_runs(block: Block, world: dict[str, object]) -> None:
    if block.marker == "skip":
        assert block.reason, f"README line {block.line}: a skipped block must say why (readme-test: skip REASON)"
        pytest.skip(f"README line {block.line}: {block.reason}")
    assert block.marker in ("", "gpu"), f"README line {block.line}: unknown marker readme-test: {block.marker}"
    if block.marker == "gpu" and not _has_cuda():
        pytest.skip(f"README line {block.line}: needs a CUDA GPU")
    home = world["home"]
    assert isinstance(home, Path)
    if block.language == "python":
        script = home / f"readme_{block.line}.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    done = subprocess.run(command, cwd=home, env=world["env"], capture_output=True, text=True, timeout=TIMEOUT_S)
    output = (done.stdout[-3000:] + "\n" + done.stderr[-3000:]).strip()
    assert done.returncode == 0, f"README line {block.line} ({block.language}) exited {done.returncode}:\n{output}"
    assert "Traceback (most recent call last)" not in done.stderr, f"README line {block.line}:\n{output}"


def test_readme_claims_hold_after_the_blocks_ran(world: dict[str, object]) -> None:
    """What the README's comments promise about the outputs its blocks made (run after them)."""
    from packer.classes import check_classes

    home = world["home"]
    assert isinstance(home, Path)
    train, val = home / "packed" / "train", home / "packed" / "val"
    if not (train / "manifest.json").is_file() or not (val / "manifest.json").is_file():
        pytest.skip("the README no longer builds packed/train and packed/val")
    check_classes(train, val)  # "same labels in every split", though val lacks a class
