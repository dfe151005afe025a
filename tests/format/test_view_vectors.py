"""The view file (SPEC §17) against its vectors: the valid file opens to its samples of
``valid/base-align512``, each damaged file fails with exactly its error at its stage, and every
rule V1-V9 has a vector and a tag in the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import packer
from packer import errors
from packer import format as fmt
from packer.viewfile import encode_view, parse_view

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "formats" / "vectors" / "views"
EXPECTED = json.loads((VECTORS / "expected.json").read_text("utf-8"))


def test_the_valid_view_opens_to_its_samples() -> None:
    valid = EXPECTED["valid"]
    data = (VECTORS / valid["file"]).read_bytes()
    view = parse_view(data)
    assert view.base == valid["base"] and view.selected.tolist() == valid["selected"]
    assert list(view.selectors) == valid["selectors"] and fmt.checksum_hex(view.rows_checksum) == valid["rows_checksum"]
    assert encode_view(view) == data  # the writer's bytes, exactly
    with packer.open_dataset(VECTORS / valid["file"]) as opened, packer.open_dataset(
            REPO / "formats" / "vectors" / "valid" / "base-align512") as base:
        assert list(opened.keys()) == valid["keys"] and len(base) == valid["base_samples"]
        assert [bytes(opened.get(i)) for i in range(len(opened))] == [bytes(base.get(i)) for i in valid["selected"]]


@pytest.mark.parametrize("name", sorted(EXPECTED["invalid"]))
def test_each_damaged_view_fails_with_its_error(name: str) -> None:
    case = EXPECTED["invalid"][name]
    path = VECTORS / case["file"]
    with pytest.raises(getattr(errors, case["error"])) as caught:
        if case["stage"] == "parse":
            parse_view(path.read_bytes(), path="x.pkview")
        else:
            parse_view(path.read_bytes())  # a well-formed file ...
            packer.open_dataset(path)  # ... whose base is not what it was made of
    assert type(caught.value).__name__ == case["error"]
    where = "x.pkview" if case["stage"] == "parse" else str(path)
    assert case["message"] in str(caught.value) and str(caught.value).startswith(where)


def test_every_rule_of_section_17_has_a_vector_and_a_check() -> None:
    spec = (REPO / "formats" / "SPEC.md").read_text("utf-8")
    rules = set(re.findall(r"^\| (V\d+) \|", spec, flags=re.M))
    assert rules == {f"V{n}" for n in range(1, 10)}
    assert {case["requirement"] for case in EXPECTED["invalid"].values()} == rules
    code = (REPO / "packer" / "viewfile.py").read_text("utf-8")
    assert set(re.findall(r"# \[(V\d+)\]", code)) == rules


def test_random_damage_is_refused_or_harmless() -> None:
    """Flip, cut or extend a valid file anywhere: a typed error, or (a header field the body does
    not cover) a view that names the same samples."""
    valid = (VECTORS / EXPECTED["valid"]["file"]).read_bytes()
    rng = np.random.default_rng(0)
    for _ in range(300):
        data = bytearray(valid)
        action = rng.integers(0, 3)
        if action == 0:
            data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
        elif action == 1:
            del data[int(rng.integers(0, len(data))):]
        else:
            data += bytes(int(rng.integers(1, 20)))
        try:
            view = parse_view(bytes(data))
        except errors.FormatError:
            continue
        assert view.selected.tolist() == EXPECTED["valid"]["selected"] and view.base == EXPECTED["valid"]["base"]
