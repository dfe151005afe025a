"""Readers ask the codec, they do not compare its name (issue 34, STYLE.md rule 14).

What a payload is (encoded image or stored pixels, its fixed shape, whether the source geometry
is kept) is answered by ``packer.codecs.codec_for(dataset)``. Outside ``packer/codecs/`` and
``packer/format.py`` (which owns the ``image_format`` values), no module may compare a codec's
name with ``"raw"`` nor test ``ImageFormat.RAW``: that is how a new codec came to touch eight
modules. Per-format code without a dataset asks ``ImageFormat.PIXEL_FORMATS``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "packer"
#: Where codec names and the raw image format may be spelled out.
OWNERS = ("codecs/", "format.py")


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {value for element in node.elts for value in _strings(element)}
    return set()


def codec_branches(source: str, where: str = "<source>") -> list[str]:
    """``where:line: code`` for every comparison of a codec name with ``"raw"`` and every use of
    ``ImageFormat.RAW`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            text = ast.unparse(node)
            if any("raw" in _strings(operand) for operand in operands) and (
                    "codec" in text.lower() or ".get('name')" in text):
                found.append(f"{where}:{node.lineno}: {text}")
        elif (isinstance(node, ast.Attribute) and node.attr == "RAW"
              and ast.unparse(node.value).split(".")[-1] == "ImageFormat"):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_reader_compares_a_codec_name_or_tests_the_raw_format() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not relative.startswith(OWNERS):
            found += codec_branches(path.read_text("utf-8"), f"packer/{relative}")
    assert not found, ("ask packer.codecs.codec_for(dataset) (or ImageFormat.PIXEL_FORMATS, per format) "
                       "instead of comparing codec names:\n" + "\n".join(found))


def test_the_scan_sees_each_spelling() -> None:
    """The scan is not blind: every way the old code branched on raw is found, and the ways of
    asking the codec are not."""
    branches = '''
if dataset.manifest.codec.get("name") == "raw": pass
if codec.get("name") != "raw": pass
if result.codec == "raw": pass
if entry.get("name") in ("passthrough", "raw") and cached: pass
if image_format == fmt.ImageFormat.RAW: pass
bad = ix.image_format != ImageFormat.RAW
reader = "raw" if codec["name"] == "raw" else None
'''
    assert [line.split(":")[1] for line in codec_branches(branches)] == ["2", "3", "4", "5", "6", "7", "8"]
    asking = '''
if codec_for(dataset).stores_pixels: pass
if image_format in ImageFormat.PIXEL_FORMATS: pass
if len(tiles) != 1 or tiles[0][0] != "raw": pass
'''
    assert codec_branches(asking) == []
