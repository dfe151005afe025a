"""README (and docs) snippets a user copies alone must say what they do: the ThreadedLoader example
defines every name it uses, and the Python API tour does not call a memoryview bytes."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(\s*)```python\s*$")


def _python_blocks() -> list[tuple[Path, int, str]]:
    blocks = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        lines = path.read_text("utf-8").splitlines()
        i = 0
        while i < len(lines):
            match = FENCE.match(lines[i])
            if match:
                indent, start, body = len(match.group(1)), i + 1, []
                i += 1
                while i < len(lines) and lines[i].strip() != "```":
                    body.append(lines[i][indent:])
                    i += 1
                blocks.append((path, start, "\n".join(body)))
            i += 1
    return blocks


def _undefined_names(code: str) -> set[str]:
    tree = ast.parse(code)
    stored, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            stored.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            stored.add(node.name)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
    return loaded - stored - set(dir(builtins))


def test_the_threaded_loader_snippet_defines_every_name_it_uses() -> None:
    blocks = [(path, line, code) for path, line, code in _python_blocks() if "ThreadedLoader(" in code]
    assert blocks, "no ThreadedLoader example found in README.md or docs/"
    for path, line, code in blocks:
        assert _undefined_names(code) == set(), f"{path.name} line {line}"


def test_the_api_tour_does_not_call_a_batch_item_bytes() -> None:
    lines = [line for path, _, code in _python_blocks() for line in code.splitlines()
             if re.match(r"\s*(bytes\()?batch\[0\]", line)]
    assert lines, "no batch[0] line found in README.md or docs/"
    for line in lines:
        code, _, comment = line.partition("#")
        assert code.strip().startswith("bytes(") or "memoryview" in comment, line


def test_a_read_batch_item_is_a_memoryview(tmp_path: Path) -> None:
    from helpers import write_images
    from packer import open_dataset
    from packer.writer import BuildOptions, build

    write_images(tmp_path / "src", {"a": 3})
    build(tmp_path / "src", tmp_path / "ds", BuildOptions(), workers=1, progress=False)
    with open_dataset(tmp_path / "ds") as ds:
        item = ds.read_batch([0, 1])[0]
        assert isinstance(item, memoryview) and bytes(item) == bytes(ds.get(0))


@pytest.mark.parametrize("code, undefined", [("for e in range(epochs):\n    pass", {"epochs"}),
                                             ("import x\nx.y(z)", {"z"})])
def test_the_undefined_name_check_can_fail(code: str, undefined: set[str]) -> None:
    assert _undefined_names(code) == undefined
