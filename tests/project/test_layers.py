"""The package's layers: no import runs back up, and no import cycle (issues 24 and 34).

Every top-level module or sub-package of ``packer`` has a layer below; an import (at module level
or inside a function) may only go to a lower layer or stay inside its own unit. The two chains
the design names are ``format -> sources -> writer`` (building) and ``dataset ->
decode/transforms -> torch / dali / gpu / threaded -> cli`` (reading). A new module must be given
a layer here, which is the moment to decide where it sits.

An import is an edge to the module it loads: ``from .. import format`` to ``packer.format``, and
``from .. import __version__`` (a name, not a module) to ``packer`` itself, whose ``__init__``
runs first. The benchmarks (``benchmarks/``, scripts that import each other as top-level modules)
have layers of their own: the shared harness and helpers below, the ``bench_*`` scripts on top,
so no script imports another.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "packer"
BENCHMARKS = REPO / "benchmarks"

#: unit (first name under packer) -> layer; imports must go to a strictly lower layer.
LAYERS = {
    # foundations: no packer imports beyond each other, downwards
    "errors": 0, "deprecation": 0, "_version": 0, "_rawresample": 0,
    # packer._internal: modules no user imports, each its own unit ("_internal.files")
    "_internal": 0,
    "_internal.names": 1, "_internal.machine": 1, "_internal.progress": 1, "fields": 1,
    "format": 2, "order": 2,
    "_internal.files": 3, "_internal.pillowformats": 3, "_internal.imageheaders": 3, "_internal.atomic": 3,
    # the photographs the guides are followed with (numpy, Pillow, the errors)
    "sampledata": 3,
    "_internal.imageinfo": 4, "backends": 4,
    # object storage: URLs, transports, the node cache (below the reader that opens URLs)
    "remote": 5,
    # where a user's path points (a local path or a URL), then where a dataset's bytes live
    # (fractional: a layer between two, so that no other unit's number changes)
    "location": 6, "place": 6.5,
    # a view's file and its rows (the dataset reader opens a view file through them)
    "viewfile": 6.5, "selection": 6.5,
    # bytes to pixels
    "decode": 5, "codecs": 6,
    # the dataset reader, then what builds on it
    "dataset": 7, "rawcrop": 8, "classes": 8,
    # several datasets read as one dataset with its own sample space
    "mixture": 7.5,
    # duplicates and leaks: over the dataset reader and the decoders, below the writer (a build
    # option may hash) and inspect (the report)
    "duplicates": 8,
    "transforms": 9,
    # building: the doors, then the writer
    "sources": 9, "writer": 10,
    # readers, checkers and converters over a dataset
    "torch": 10, "dali": 10, "verify": 10, "export": 10, "inspect": 10,
    "threaded": 11, "gpu": 11,
    # making views: selectors over a dataset, --keys files (export.select), duplicates
    "views": 10.5,
    # bench times every reader, ThreadedLoader included (--loader threaded)
    "bench": 11.5,
    # integrations with other frameworks: over the torch readers, or over the dataset and orders
    "lightning": 11, "grain": 11, "tvtensors": 11,
    # the shells
    "cli": 12, "__main__": 13, "packer": 13,
}

#: benchmarks/ module -> layer. Every ``bench_*`` script is on ``BENCH_SCRIPTS``: they share
#: helpers through the modules below (the timing harness; the peers' loaders and the timed rounds;
#: datasets written straight in the format), never by importing one another.
BENCH_LAYERS = {"harness": 0, "ffcv_write": 0, "writers_run": 0, "peers_common": 1, "synthetic": 1}
BENCH_SCRIPTS = 2


def _modules() -> dict[str, Path]:
    """Every module of packer: its Python files, and the C extensions built from its ``.c`` files
    (``setup.py``), which import nothing of packer."""
    mods = {}
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.c")]:
        name = ".".join(("packer", *path.relative_to(PACKAGE).with_suffix("").parts))
        mods[name.removesuffix(".__init__")] = path
    return mods


def _bench_modules() -> dict[str, Path]:
    return {path.stem: path for path in BENCHMARKS.glob("*.py")}


def _targets(module: str, path: Path, node: ast.AST, mods: dict[str, Path]) -> list[str]:
    """What an import statement loads: ``import a.b`` loads ``a.b``; ``from X import name`` loads
    the module ``X.name`` when there is one, else ``X`` (whose namespace holds ``name``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        base = f"{base}.{node.module}" if node.module else base
    else:
        base = node.module or ""
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base for alias in node.names]


def module_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """importing module -> the modules of ``mods`` it imports (module level or inside functions)."""
    edges: dict[str, set[str]] = {module: set() for module in mods}
    for module, path in mods.items():
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(module, path, node, mods):
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in mods and target != module:
                    edges[module].add(target)
    return edges


def _unit(module: str) -> str:
    """The unit a module belongs to: its first name under packer (``torch``, ``writer``), or
    ``_internal.<name>`` for the private modules, which are units of their own."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "_internal":
        return f"_internal.{parts[2]}"
    return parts[1] if len(parts) > 1 else "packer"


def import_edges() -> set[tuple[str, str, str]]:
    """(importing module, imported unit, importing unit) for every import between units of packer."""
    return {(module, _unit(target), _unit(module))
            for module, targets in module_edges(_modules()).items() for target in targets
            if _unit(target) != _unit(module)}


def _bench_layer(module: str) -> int | None:
    return BENCH_SCRIPTS if module.startswith("bench_") else BENCH_LAYERS.get(module)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_every_unit_has_a_layer() -> None:
    units = {_unit(module) for module in _modules()}
    missing = sorted(units - set(LAYERS))
    assert not missing, f"give these new packer modules a layer in {__file__}: {missing}"


def test_no_import_runs_back_up() -> None:
    upward = sorted(f"{module} imports {'packer' if target == 'packer' else 'packer.' + target} "
                    f"(layer {LAYERS.get(target)} >= {LAYERS.get(unit)})"
                    for module, target, unit in import_edges()
                    if unit in LAYERS and target in LAYERS and LAYERS[target] >= LAYERS[unit])
    assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)


def test_no_import_cycle_in_packer() -> None:
    found = cycles(module_edges(_modules()))
    assert not found, "import cycles (function-level imports included):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_check_sees_an_upward_import() -> None:
    """The edge finder is not blind: the writer's imports of the sources are found."""
    assert any(unit == "writer" and target == "sources" for _, target, unit in import_edges())


def test_a_name_imported_from_a_package_is_an_edge_to_its_init(tmp_path: Path) -> None:
    """``from .. import name`` runs the package's ``__init__``: an edge to it, not nothing; a
    module named in ``from . import`` is an edge to that module, a C extension a module too."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("from .sub import leaf\nversion = 1\n")
    (tmp_path / "pkg" / "_ext.c").write_text("/* a C extension */\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "leaf.py").write_text(
        "from .. import version\nfrom .. import _ext\ndef f():\n    from . import other\n")
    (tmp_path / "pkg" / "sub" / "other.py").write_text("")
    mods = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg._ext": tmp_path / "pkg" / "_ext.c",
            "pkg.sub": tmp_path / "pkg" / "sub" / "__init__.py", "pkg.sub.leaf": tmp_path / "pkg" / "sub" / "leaf.py",
            "pkg.sub.other": tmp_path / "pkg" / "sub" / "other.py"}
    edges = module_edges(mods)
    assert edges["pkg.sub.leaf"] == {"pkg", "pkg._ext", "pkg.sub.other"}
    assert edges["pkg"] == {"pkg.sub.leaf"}
    assert cycles(edges) == [["pkg", "pkg.sub.leaf"]]


def test_every_benchmark_has_a_layer() -> None:
    missing = sorted(name for name in _bench_modules() if _bench_layer(name) is None)
    assert not missing, f"give these benchmarks/ modules a layer in {__file__} (BENCH_LAYERS): {missing}"


def test_no_benchmark_imports_its_own_layer_or_above_and_none_imports_in_a_circle() -> None:
    mods = _bench_modules()
    edges = module_edges(mods)
    upward = sorted(f"benchmarks/{module}.py imports {target} (layer {_bench_layer(target)} >= "
                    f"{_bench_layer(module)})" for module, targets in edges.items() for target in targets
                    if (_bench_layer(target) or 0) >= (_bench_layer(module) or 0))
    assert not upward, ("benchmark scripts share helpers through harness.py, peers_common.py or synthetic.py, not "
                        "by importing each other:\n" + "\n".join(upward))
    assert not cycles(edges)
    assert any("harness" in targets for targets in edges.values())  # the check is not blind
