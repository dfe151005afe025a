"""No bare ``ValueError``, ``TypeError``, ``KeyError`` or ``IndexError`` for a user's mistake (issue 34).

STYLE.md, "Errors": a bad option or bad data gets a ``PackerError`` subclass whose message says what
was expected and what came (``OptionError`` is also a ``ValueError``; ``SampleIndexError``,
``SampleIndexTypeError`` and ``SampleKeyError`` are also the ``IndexError`` / ``TypeError`` /
``KeyError`` Python's sequences and mappings raise). This test scans every ``raise`` in ``packer/``
and fails on a bare built-in one that is not listed below with the reason it is not a user's
mistake: a protocol Python relies on, an exception caught a few lines away and turned into a typed
error or a rejection, or an internal invariant only a packer bug can break.

Keys are ``file::function::Class#n`` (the n-th raise of that class in that function), as in
``scripts/promise_inventory.py``, so edits elsewhere in a file keep them.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BARE = ("ValueError", "TypeError", "KeyError", "IndexError")

_CAUGHT_BY_PLAN_LOAD = ("a saved plan's columns that disagree: writer.plan.load_plan catches it as a BuildError "
                        "naming the plan")
_CAUGHT_BY_EXPORT = ("caught by SampleNamer.entries and recorded as the sample's 'unrepresentable' problem "
                     "(UnsafeExportError, or skipped with --skip-unsafe)")
_CAUGHT_BY_SIDEFILES = ("caught by sidefiles.assemble_sample and raised as a FieldValueError naming the field "
                        "(a rejection of the sample)")
_JSON_HOOK = "a json.loads parse_constant/parse_float hook: json raises it as its own ValueError, caught by the caller"
_WRITER_GUARD = ("the writer's own guard: writing a file a reader would refuse is a packer bug (readers refuse the "
                 "same thing with a FormatError)")
_RAW_VIEW = ("internal: the raw readers call it after the layout check (rawcrop / the raw codec validate shape, stride "
             "and offsets against the index first); only a packer bug reaches it")

#: Bare raises that are not a user's mistake, each with the reason.
ALLOWED = {
    "packer/selection.py::_SelectedFields.__getitem__::KeyError#1":
        "the Mapping protocol of a view's field_columns (as the base's dict raises): callers ask by declared names",
    "packer/mixture.py::_ConcatFields.__getitem__::KeyError#1":
        "the Mapping protocol of a mixture's field_columns (as a dataset's dict raises): callers ask by declared names",
    "packer/cli/options.py::SizeType.convert::ValueError#1":
        "caught on the next lines of the same try and reported as click's usage error (self.fail, exit 2)",
    "packer/codecs/raw.py::raw_batch_view::ValueError#1": _RAW_VIEW,
    "packer/codecs/raw.py::raw_batch_view::ValueError#2": _RAW_VIEW,
    "packer/codecs/raw.py::raw_samples_view::ValueError#1": _RAW_VIEW,
    "packer/codecs/tiles.py::window_jpeg::ValueError#1":
        "caught by cut_window, which then decodes the whole image (a window that does not fit is not an error)",
    "packer/codecs/tiles.py::window_jpeg::ValueError#2":
        "caught by cut_window, which then decodes the whole image (a tile table that does not match the data)",
    "packer/export/plan.py::SampleNamer._field_entries::ValueError#1": _CAUGHT_BY_EXPORT,
    "packer/export/plan.py::SampleNamer._field_entries::ValueError#2": _CAUGHT_BY_EXPORT,
    "packer/export/plan.py::SampleNamer._field_entries::ValueError#3": _CAUGHT_BY_EXPORT,
    "packer/export/plan.py::SampleNamer._webdataset_members::ValueError#1": _CAUGHT_BY_EXPORT,
    "packer/fields.py::_reject_constant::ValueError#1": _JSON_HOOK,
    "packer/fields.py::encode_value::ValueError#1":
        "internal: every caller of a classes field passes its vocabulary (the build's field table owns it)",
    "packer/fields.py::encode_value::ValueError#2":
        "internal: image fields are stored as shards, never through encode_value; a new kind must add its branch",
    "packer/format.py::_reject_constant::ValueError#1": _JSON_HOOK,
    "packer/format.py::shard_file_name::ValueError#1": _WRITER_GUARD,
    "packer/format.py::field_shard_file_name::ValueError#1": _WRITER_GUARD,
    "packer/format.py::encode_column_file::ValueError#1": _WRITER_GUARD,
    "packer/format.py::encode_column_file::ValueError#2": _WRITER_GUARD,
    "packer/format.py::encode_column_file::ValueError#3": _WRITER_GUARD,
    "packer/format.py::encode_column_file::ValueError#4": _WRITER_GUARD,
    "packer/format.py::encode_column_file::ValueError#5": _WRITER_GUARD,
    "packer/format.py::Manifest.field::KeyError#1":
        "a lookup by name in the parsed manifest; Dataset.field_spec, the door a user's name comes through, "
        "turns it into an OptionError listing the fields there are",
    "packer/order.py::RankPlan.batch::IndexError#1":
        "RankPlan is a sequence of batches: IndexError past the end is the sequence contract; every reader "
        "loops over range(num_batches)",
    "packer/sources/detect.py::_Range.__getitem__::IndexError#1":
        "the Sequence protocol of a lazy brace range (Sequence.__iter__ stops at IndexError); private",
    "packer/sources/fieldvalues.py::FieldTable.from_plan_columns::ValueError#1": _CAUGHT_BY_PLAN_LOAD,
    "packer/sources/fieldvalues.py::FieldTable.from_plan_columns::ValueError#2": _CAUGHT_BY_PLAN_LOAD,
    "packer/sources/members.py::members_from_columns::ValueError#1": _CAUGHT_BY_PLAN_LOAD,
    "packer/sources/members.py::MemberReader.read::TypeError#1":
        "internal: a folder source has no member table and its readers never call read (a packer bug)",
    "packer/sources/members.py::_inflate::ValueError#1":
        "caught by MemberReader.read, which rejects the member as 'unreadable' with the message",
    "packer/sources/sidefiles.py::_text::ValueError#1": _CAUGHT_BY_SIDEFILES,
    "packer/sources/sidefiles.py::_text::ValueError#2": _CAUGHT_BY_SIDEFILES,
    "packer/sources/sidefiles.py::_json::ValueError#1": _CAUGHT_BY_SIDEFILES,
    "packer/sources/sidefiles.py::_json::ValueError#2": _CAUGHT_BY_SIDEFILES,
    "packer/sources/strictjson.py::_reject_constant::ValueError#1": _JSON_HOOK,
    "packer/sources/strictjson.py::_finite_float::ValueError#1": _JSON_HOOK,
    "packer/sources/strictjson.py::parse_strict_json::ValueError#1":
        "json.loads's contract (a ValueError, like its JSONDecodeError): every door that parses a user's JSON "
        "catches ValueError and names the file and row in a SourceError or a rejection",
    "packer/torch/pipeline.py::_BatchSamples.__getitem__::IndexError#1":
        "the Sequence protocol of a batch's samples (Sequence.__iter__ and collate functions stop at IndexError)",
}


class _BareRaises(ast.NodeVisitor):
    def __init__(self, file: str) -> None:
        self.file = file
        self.scope: list[str] = []
        self.counts: dict[tuple[str, str], int] = defaultdict(int)
        self.found: dict[str, int] = {}

    def _scoped(self, node: ast.AST) -> None:
        self.scope.append(node.name)  # type: ignore[attr-defined]
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        name = exc.id if isinstance(exc, ast.Name) else exc.attr if isinstance(exc, ast.Attribute) else None
        if name in BARE:
            function = ".".join(self.scope) or "<module>"
            self.counts[(function, name)] += 1
            self.found[f"{self.file}::{function}::{name}#{self.counts[(function, name)]}"] = node.lineno
        self.generic_visit(node)


def bare_raises(root: Path = REPO) -> dict[str, int]:
    """``key -> line`` of every ``raise ValueError/TypeError/KeyError/IndexError`` under ``packer/``."""
    found: dict[str, int] = {}
    for path in sorted((root / "packer").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        finder = _BareRaises(rel)
        finder.visit(ast.parse(path.read_text("utf-8"), rel))
        found.update(finder.found)
    return found


def test_no_bare_builtin_raise_outside_the_allow_list() -> None:
    new = sorted(f"{key} (line {line})" for key, line in bare_raises().items() if key not in ALLOWED)
    assert not new, ("raise a packer.errors class (OptionError for a bad argument, a FormatError for bad data, ...) "
                     "naming what was expected and what came, or list the site in ALLOWED with the reason no "
                     "user can reach it:\n" + "\n".join(new))


def test_every_allowed_site_still_exists_and_has_a_reason() -> None:
    found = bare_raises()
    gone = sorted(key for key in ALLOWED if key not in found)
    assert not gone, f"listed in ALLOWED but no longer a bare raise (converted, or renamed: update the key): {gone}"
    assert all(len(reason) > 30 for reason in ALLOWED.values())


def test_the_scan_sees_every_spelling(tmp_path: Path) -> None:
    """Calls, bare names, attribute spellings, nested scopes; a typed error or a re-raise is not counted."""
    (tmp_path / "packer").mkdir()
    (tmp_path / "packer" / "mod.py").write_text(
        "import builtins\n"
        "def f(x):\n"
        "    if x:\n"
        "        raise ValueError(f'bad {x}')\n"
        "    raise KeyError\n"
        "class C:\n"
        "    def __getitem__(self, i):\n"
        "        raise builtins.IndexError(i) from None\n"
        "    def g(self):\n"
        "        try:\n"
        "            pass\n"
        "        except TypeError:\n"
        "            raise\n"
        "        raise OptionError('typed')\n"
        "        raise TypeError('second')\n")
    assert bare_raises(tmp_path) == {"packer/mod.py::f::ValueError#1": 4, "packer/mod.py::f::KeyError#1": 5,
                                     "packer/mod.py::C.__getitem__::IndexError#1": 8,
                                     "packer/mod.py::C.g::TypeError#1": 15}
