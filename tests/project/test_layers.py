"""The package's layers: no import runs back up (issue 24).

Every top-level module or sub-package of ``packer`` has a layer below; an import (at module level
or inside a function) may only go to a lower layer or stay inside its own unit. The two chains
the design names are ``format -> sources -> writer`` (building) and ``dataset ->
decode/transforms -> torch / dali / gpu / threaded -> cli`` (reading). A new module must be given
a layer here, which is the moment to decide where it sits.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "packer"

#: unit (first name under packer) -> layer; imports must go to a strictly lower layer.
LAYERS = {
    # foundations: no packer imports beyond each other, downwards
    "errors": 0, "deprecation": 0, "names": 1, "machine": 1, "progress": 1, "fields": 1,
    "format": 2, "order": 2,
    "files": 3, "pillowformats": 3,
    "imageinfo": 4, "backends": 4,
    # object storage: URLs, transports, the node cache (below the reader that opens URLs)
    "remote": 5,
    # bytes to pixels
    "decode": 5, "codecs": 6,
    # the dataset reader, then what builds on it
    "dataset": 7, "rawcrop": 8, "classes": 8,
    "transforms": 9,
    # building: the doors, then the writer
    "sources": 9, "writer": 10,
    # readers, checkers and converters over a dataset
    "torch": 10, "dali": 10, "verify": 10, "export": 10, "inspect": 10,
    "threaded": 11, "gpu": 11, "bench": 11,
    # integrations with other frameworks: over the torch readers, or over the dataset and orders
    "lightning": 11, "grain": 11, "tvtensors": 11,
    # the shells
    "cli": 12, "__main__": 13, "packer": 13,
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(("packer", *path.relative_to(PACKAGE).with_suffix("").parts))
        mods[name.removesuffix(".__init__")] = path
    return mods


def _targets(module: str, path: Path, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    return [target, *(f"{target}.{alias.name}" for alias in node.names)]


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "packer"


def import_edges() -> set[tuple[str, str, str]]:
    """(importing module, imported unit, importing unit) for every import between units."""
    mods = _modules()
    edges = set()
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(module, path, node):
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target not in mods or target == "packer" and isinstance(node, ast.ImportFrom) and node.level:
                    continue  # `from .. import format` names the module, checked through its own name
                if _unit(target) != _unit(module):
                    edges.add((module, _unit(target), _unit(module)))
    return edges


def test_every_unit_has_a_layer() -> None:
    units = {_unit(module) for module in _modules()}
    missing = sorted(units - set(LAYERS))
    assert not missing, f"give these new packer modules a layer in {__file__}: {missing}"


def test_no_import_runs_back_up() -> None:
    upward = sorted(f"{module} imports packer.{target} (layer {LAYERS.get(target)} >= {LAYERS.get(unit)})"
                    for module, target, unit in import_edges()
                    if unit in LAYERS and target in LAYERS and LAYERS[target] >= LAYERS[unit])
    assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import() -> None:
    """The edge finder is not blind: the writer's imports of the sources are found."""
    assert any(unit == "writer" and target == "sources" for _, target, unit in import_edges())
