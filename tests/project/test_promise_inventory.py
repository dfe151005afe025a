"""scripts/promise_inventory.py: which typed-error sites it finds, how it keys them, how it reads
coverage's per-test contexts and the allowlist, and when --check fails (on fabricated data)."""

from __future__ import annotations

from pathlib import Path

import pytest

import promise_inventory as inventory  # scripts/ is on sys.path (tests/conftest.py)

MODULE = '''
from .errors import OptionError, SourceError

def check(x):
    if x < 0:
        raise OptionError(f"x must be positive, got {x}")
    if x > 9:
        raise OptionError("x too big")
    error = SourceError("made, not raised")
    return error

class Reader:
    def open(self):
        raise SourceError(
            "spans "
            "lines")
'''


@pytest.fixture
def fake_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "packer").mkdir()
    (tmp_path / "packer" / "mod.py").write_text(MODULE)
    (tmp_path / "packer" / "errors.py").write_text("class X: pass\n")
    monkeypatch.setattr(inventory, "REPO", tmp_path)
    monkeypatch.setattr(inventory, "PACKAGE", tmp_path / "packer")
    return tmp_path


def test_sites_are_every_construction_keyed_by_function_class_and_order(fake_repo: Path) -> None:
    sites = inventory.find_sites({"OptionError", "SourceError", "PackerError"})
    assert [s.key for s in sites] == ["packer/mod.py::check::OptionError#1", "packer/mod.py::check::OptionError#2",
                                      "packer/mod.py::check::SourceError#1", "packer/mod.py::Reader.open::SourceError#1"]
    assert [(s.first_line, s.last_line, s.raised) for s in sites] == [(6, 6, True), (8, 8, True), (9, 9, False),
                                                                      (14, 16, True)]
    assert sites[0].message == "x must be positive, got {…}"


def test_tests_come_from_coverage_contexts_of_any_line_of_the_site(fake_repo: Path) -> None:
    from coverage import CoverageData

    data = CoverageData(basename=str(fake_repo / ".coverage"))
    source = str(fake_repo / "packer" / "mod.py")
    data.set_context("tests/a/test_x.py::test_small|run")
    data.add_lines({source: [6]})
    data.set_context("tests/b/test_y.py::test_open|run")
    data.add_lines({source: [15]})
    data.set_context("")
    data.add_lines({source: [8]})  # a line run outside any test (an import) does not count
    data.write()
    sites = inventory.find_sites({"OptionError", "SourceError"})
    inventory.attach_tests(sites, fake_repo / ".coverage")
    assert {s.key: s.tests for s in sites} == {
        "packer/mod.py::check::OptionError#1": ["tests/a/test_x.py::test_small"],
        "packer/mod.py::check::OptionError#2": [],
        "packer/mod.py::check::SourceError#1": [],
        "packer/mod.py::Reader.open::SourceError#1": ["tests/b/test_y.py::test_open"]}


def test_check_fails_on_an_unreached_site_without_a_reason(fake_repo: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from coverage import CoverageData

    data = CoverageData(basename=str(fake_repo / ".coverage"))
    data.set_context("tests/a/test_x.py::test_small|run")
    data.add_lines({str(fake_repo / "packer" / "mod.py"): [6, 8, 14]})
    data.write()
    monkeypatch.setattr(inventory, "error_classes", lambda: {"OptionError", "SourceError"})
    allow = fake_repo / "allow.txt"
    monkeypatch.setattr(inventory, "ALLOWLIST", allow)
    allow.write_text("# comment\npacker/mod.py::check::OptionError#1  # wrongly listed: a test reaches it\n"
                     "packer/mod.py::gone::OptionError#1  # renamed since\n")
    assert inventory.main(["--check", "--data", str(fake_repo / ".coverage")]) == 1
    out = capsys.readouterr().out
    assert "unreached packer/mod.py::check::SourceError#1 (line 9, 'made, not raised'): NEW" in out
    assert "warning: packer/mod.py::check::OptionError#1 is listed as unreached but a test reaches it" in out
    assert "warning: packer/mod.py::gone::OptionError#1 is listed as unreached but is no longer a site" in out
    allow.write_text("packer/mod.py::check::SourceError#1  # a reason\n")
    assert inventory.main(["--check", "--data", str(fake_repo / ".coverage")]) == 0
    assert "1 unreached with a written reason, 0 unreached without one" in capsys.readouterr().out


def test_every_allowlisted_key_is_a_site_of_the_package() -> None:
    """The real allowlist names real sites, each with a reason (coverage is not needed for this)."""
    keys = {s.key for s in inventory.find_sites()}
    listed = inventory.load_allowlist()
    assert listed and all(listed.values())
    assert set(listed) <= keys, sorted(set(listed) - keys)
