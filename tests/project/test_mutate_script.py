"""scripts/mutate.py's bookkeeping: the equivalents list, the kill-rate table and its warnings.

The mutation run itself is too slow for the suite (README, "Mutation testing"); what it reports
from mutmut's result files is checked here on a fabricated cache.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import mutate  # scripts/ is on sys.path (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def test_every_listed_equivalent_names_a_mutated_module_and_gives_a_reason() -> None:
    modules = {m[:-3].replace("/", ".") for g in mutate.GROUPS for m in g.modules}
    seen: set[str] = set()
    for line in (REPO / "scripts" / "mutate_equivalent.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, hash_sign, reason = line.partition("#")
        name = name.strip()
        assert hash_sign and reason.strip(), f"no reason given: {line!r}"
        assert re.fullmatch(r"[\w.ǁ]+__mutmut_\d+", name), f"not a mutant name: {name!r}"
        assert name.split(".x")[0] in modules, f"{name}: not a module of any group"
        assert name not in seen, f"{name} is listed twice"
        seen.add(name)
    assert seen and seen == set(mutate.load_equivalent())


@pytest.fixture()
def fake_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A group 'order' whose mutmut cache holds six mutants, and an equivalents list for it."""
    monkeypatch.setattr(mutate, "WORK", tmp_path / ".mutate")
    meta = tmp_path / ".mutate" / "order" / "mutants" / "packer" / "order.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {"packer.order.x_a__mutmut_1": 1, "packer.order.x_a__mutmut_2": 0, "packer.order.x_a__mutmut_3": 0,
             "packer.order.x_b__mutmut_1": 33, "packer.order.x_b__mutmut_2": -24, "packer.order.x_b__mutmut_3": None,
             "packer.order.x_c__mutmut_1": 1}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    equivalent = tmp_path / "equivalent.txt"
    equivalent.write_text("# comment\n\npacker.order.x_a__mutmut_3  # cannot change behaviour\n"
                          "packer.order.x_c__mutmut_1  # wrongly listed: a test kills it\n"
                          "packer.order.x_gone__mutmut_9  # its function was removed\n")
    monkeypatch.setattr(mutate, "EQUIVALENT_FILE", equivalent)
    return tmp_path


def test_table_counts_kills_survivors_and_equivalents(fake_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    left = mutate.table([mutate.GROUPS_BY_NAME["order"]])
    out = capsys.readouterr().out
    # 7 mutants, 2 listed equivalent, 1 not run: killed 2 (exit 1 and a timeout) of 4 judged
    assert "| packer/order.py | 7 | 2 | 2 | 1 | 1 | 1 | 50.0 % |" in out
    assert left == 2
    assert "  survived: packer.order.x_a__mutmut_2" in out
    assert "  survived (no test reaches it): packer.order.x_b__mutmut_1" in out
    assert "x_a__mutmut_3" not in out.split("| module |")[0]  # an equivalent is not a survivor
    assert "warning: packer.order.x_gone__mutmut_9 is listed as equivalent but is no longer a mutant" in out
    assert "warning: packer.order.x_c__mutmut_1 is listed as equivalent but a test kills it" in out
    assert "x_a__mutmut_3 is listed" not in out


def test_load_equivalent_reads_name_and_reason(fake_cache: Path) -> None:
    assert mutate.load_equivalent() == {"packer.order.x_a__mutmut_3": "cannot change behaviour",
                                        "packer.order.x_c__mutmut_1": "wrongly listed: a test kills it",
                                        "packer.order.x_gone__mutmut_9": "its function was removed"}


def test_torch_group_counts_only_the_state_functions() -> None:
    torch_group = mutate.GROUPS_BY_NAME["torch"]
    assert torch_group.in_scope("packer.torch.samplers.xǁPackedSamplerǁ__iter____mutmut_4")
    assert torch_group.in_scope("packer.torch.loader.x__deal__mutmut_1")
    assert not torch_group.in_scope("packer.torch.collate.x_collate__mutmut_1")
    assert mutate.GROUPS_BY_NAME["order"].in_scope("anything")


def test_every_group_names_test_files_and_tests_that_exist() -> None:
    """The groups follow the tests when they move: each listed file exists, each node id names a test in it."""
    import ast

    listed = {t for g in mutate.GROUPS for t in g.tests} | set(mutate.COMMON_TESTS)
    for entry in sorted(listed):
        path, _, name = entry.partition("::")
        assert (REPO / path).is_file(), f"{entry}: no such test file"
        if name:
            tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
            assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, f"{entry}: no such test"
    atomic = mutate.test_selection(mutate.GROUPS_BY_NAME["atomic"])
    assert "tests/writer/test_interrupted_builds.py" in atomic
    assert not any(t.startswith("tests/writer/test_interrupted_builds.py::") for t in atomic), "a file and its node ids"
    order = mutate.test_selection(mutate.GROUPS_BY_NAME["order"])
    assert len(order) == len(set(order))
    assert "tests/writer/test_interrupted_builds.py::test_a_record_of_a_truncated_shard_is_redone_by_pack" in order
