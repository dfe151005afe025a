#!/usr/bin/env python3
"""The promise inventory: every place packer makes a typed error, and the tests that reach it.

Usage (from the repository root, after a test run with per-test coverage contexts, which
``make test`` does: ``pytest --cov --cov-context=test``)::

    python scripts/promise_inventory.py            # the unreached sites, then a summary
    python scripts/promise_inventory.py --tests    # every site with up to 3 tests that reach it
    python scripts/promise_inventory.py --json     # one JSON document
    python scripts/promise_inventory.py --check    # exit 1 on an unreached site not in the allowlist

A *site* is a call that constructs a ``PackerError`` subclass in ``packer/`` (``raise
ManifestError(...)``, ``error = DecodeError(...)``): the refusals a user can meet. Its key is
``file::function::ErrorClass#n`` (the n-th such call of that class in that function), which
survives edits elsewhere in the file. A site is *reached* when a test (a coverage context
``tests/...::test_name``) ran one of its lines. Coverage sees the pytest process only: a site
reached only in a subprocess (the CLI run with ``subprocess``, DataLoader or build workers) or
only on a GPU counts as unreached until an in-process test reaches it, or until it is listed in
``scripts/promise_unreached.txt`` with the reason no test can (``KEY  # reason``).

``--check`` fails on an unreached site that is not listed, and warns about listed sites that a
test now reaches or that no longer exist (an edit renamed the function: update the key).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "packer"
ALLOWLIST = REPO / "scripts" / "promise_unreached.txt"


@dataclass
class Site:
    """One construction of a typed error."""

    file: str           # relative to the repository, e.g. packer/format.py
    function: str       # qualified name inside the module, "<module>" at top level
    error: str          # the PackerError subclass
    ordinal: int        # 1-based among the calls of ``error`` in ``function``
    first_line: int
    last_line: int
    raised: bool        # ``raise Error(...)`` rather than a constructed value
    message: str        # the literal start of the message, for reading the list
    tests: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.file}::{self.function}::{self.error}#{self.ordinal}"


def error_classes() -> set[str]:
    """Names of PackerError and every subclass (imported from packer.errors, walked recursively)."""
    sys.path.insert(0, str(REPO))
    from packer.errors import PackerError

    names, todo = set(), [PackerError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _message_start(call: ast.Call) -> str:
    for arg in call.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value[:70]
        if isinstance(arg, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "{…}" for v in arg.values)[:70]
    return ""


class _SiteFinder(ast.NodeVisitor):
    def __init__(self, file: str, classes: set[str]) -> None:
        self.file, self.classes = file, classes
        self.scope: list[str] = []
        self.statement: list[ast.stmt] = []
        self.raised: set[int] = set()
        self.sites: list[Site] = []
        self.counts: dict[tuple[str, str], int] = defaultdict(int)

    def _scoped(self, node: ast.AST) -> None:
        self.scope.append(node.name)  # type: ignore[attr-defined]
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt):
            self.statement.append(node)
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                self.raised.add(id(node.exc))
            super().generic_visit(node)
            self.statement.pop()
        else:
            super().generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _called_name(node)
        if name in self.classes and name != "PackerError" or (name == "PackerError" and id(node) in self.raised):
            function = ".".join(self.scope) or "<module>"
            self.counts[(function, name)] += 1
            stmt = self.statement[-1]
            # coverage records the lines a statement executes; a raise spanning lines counts from its
            # first line to the end of the call (not the end of an enclosing block)
            first = stmt.lineno if not isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)) else node.lineno
            self.sites.append(Site(self.file, function, name, self.counts[(function, name)], first,
                                   node.end_lineno or node.lineno, id(node) in self.raised, _message_start(node)))
        self.generic_visit(node)


def find_sites(classes: set[str] | None = None) -> list[Site]:
    """Every construction of a PackerError subclass under packer/, in file and line order."""
    classes = classes or error_classes()
    sites: list[Site] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "packer/errors.py":
            continue  # the classes themselves, and _rebuild_error
        finder = _SiteFinder(rel, classes)
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), rel))
        sites += finder.sites
    return sites


def attach_tests(sites: list[Site], data_file: Path) -> None:
    """Fill ``site.tests`` from coverage's per-test contexts."""
    from coverage import CoverageData

    if not data_file.exists():
        raise SystemExit(f"{data_file}: no coverage data; run the tests with --cov --cov-context=test first")
    data = CoverageData(basename=str(data_file))
    data.read()
    by_file: dict[str, dict[int, list[str]]] = {}
    measured = {Path(f).resolve().relative_to(REPO).as_posix(): f for f in data.measured_files()
                if Path(f).resolve().is_relative_to(REPO)}
    for site in sites:
        if site.file not in by_file:
            by_file[site.file] = data.contexts_by_lineno(measured[site.file]) if site.file in measured else {}
        contexts = by_file[site.file]
        tests = set()
        for line in range(site.first_line, site.last_line + 1):
            for context in contexts.get(line, ()):
                if context:  # "" is the context of lines run outside any test (imports, collection)
                    tests.add(context.split("|")[0])
        site.tests = sorted(tests)


def load_allowlist(path: Path | None = None) -> dict[str, str]:
    """``key -> reason`` from the allowlist (``KEY  # reason`` lines; ``#`` lines are comments)."""
    path = ALLOWLIST if path is None else path
    listed: dict[str, str] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, _, rest = line.strip().partition(" ")  # the key holds a '#' of its own
            listed[key] = rest.strip().removeprefix("#").strip()
    return listed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / ".coverage", help="coverage data file")
    parser.add_argument("--tests", action="store_true", help="list every site with the tests that reach it")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--check", action="store_true", help="exit 1 on an unreached site not in the allowlist")
    args = parser.parse_args(argv)

    sites = find_sites()
    attach_tests(sites, args.data)
    listed = load_allowlist()
    keys = {s.key for s in sites}
    unreached = [s for s in sites if not s.tests]
    new = [s for s in unreached if s.key not in listed]
    now_reached = sorted(k for k in listed if k in keys and any(s.key == k and s.tests for s in sites))
    gone = sorted(k for k in listed if k not in keys)

    if args.json:
        print(json.dumps({"sites": len(sites), "reached": len(sites) - len(unreached),
                          "unreached": [{"key": s.key, "line": s.first_line, "message": s.message,
                                         "allowed": listed.get(s.key)} for s in unreached],
                          "allowlist_reached": now_reached, "allowlist_gone": gone,
                          "tests": {s.key: s.tests for s in sites}}, indent=1, sort_keys=True))
    else:
        if args.tests:
            for s in sites:
                shown = ", ".join(s.tests[:3]) + (f" (+{len(s.tests) - 3})" if len(s.tests) > 3 else "")
                print(f"{s.file}:{s.first_line} {s.error} in {s.function}: {shown or 'NO TEST'}")
        for s in unreached:
            why = listed.get(s.key)
            tag = f"allowed: {why}" if why else "NEW: no test reaches it"
            print(f"unreached {s.key} (line {s.first_line}, {s.message!r}): {tag}")
        for key in now_reached:
            print(f"warning: {key} is listed as unreached but a test reaches it: remove it from {ALLOWLIST.name}")
        for key in gone:
            print(f"warning: {key} is listed as unreached but is no longer a site (renamed or removed)")
        print(f"promise inventory: {len(sites)} typed-error sites in packer/, {len(sites) - len(unreached)} reached "
              f"by a test in this process, {len(unreached) - len(new)} unreached with a written reason, "
              f"{len(new)} unreached without one")
    return 1 if args.check and new else 0


if __name__ == "__main__":
    sys.exit(main())
