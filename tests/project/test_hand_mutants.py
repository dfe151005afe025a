"""scripts/hand_mutants.py and the records of tests/mutants/: every record applies to the code as it
is (its original text found exactly once), the round covers the areas issue 31 names, and a run
restores the mutated file byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

import hand_mutants  # scripts/ is on sys.path (tests/conftest.py)


def test_every_record_applies_exactly_once_and_names_existing_tests() -> None:
    mutants = hand_mutants.load()
    problems = [p for m in mutants for p in hand_mutants.check(m)]
    assert not problems, "\n".join(problems)
    assert len(mutants) >= 30
    assert {"export", "sources", "writer", "readers", "torch", "transforms", "verify", "format", "cli"} <= {
        m.area for m in mutants}
    assert all(m.user_sees.strip() for m in mutants)


def test_a_record_whose_text_is_gone_or_repeated_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hand_mutants, "REPO", tmp_path)
    (tmp_path / "mod.py").write_text("x = 1\nx = 1\ny = 2\n")
    (tmp_path / "tests").mkdir()
    make = lambda original: hand_mutants.Mutant("m", "a", "mod.py", original, "z = 3", "z", ["tests"])  # noqa: E731
    assert hand_mutants.check(make("y = 2")) == []
    assert "found 2 times" in hand_mutants.check(make("x = 1"))[0]
    assert "found 0 times" in hand_mutants.check(make("w = 0"))[0]


def test_a_run_restores_the_file_and_its_mtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hand_mutants, "REPO", tmp_path)
    (tmp_path / "mod.py").write_text("VALUE = 1\n")
    (tmp_path / "test_mod.py").write_text("import mod\n\ndef test_value():\n    assert mod.VALUE == 1\n")
    before = (tmp_path / "mod.py").stat().st_mtime_ns
    killed = hand_mutants.Mutant("m", "a", "mod.py", "VALUE = 1", "VALUE = 2", "a wrong value", ["test_mod.py"])
    verdict, _, _ = hand_mutants.run_one(killed, killed.tests, timeout=120)
    assert verdict == "killed"
    survived = hand_mutants.Mutant("n", "a", "mod.py", "VALUE = 1", "VALUE = 1  # same", "nothing", ["test_mod.py"])
    assert hand_mutants.run_one(survived, survived.tests, timeout=120)[0] == "survived"
    assert (tmp_path / "mod.py").read_text() == "VALUE = 1\n"
    assert (tmp_path / "mod.py").stat().st_mtime_ns == before
