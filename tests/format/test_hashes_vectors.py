"""The perceptual-hashes file (SPEC §16) against its vectors: the valid file reads to its values,
each damaged file fails with exactly its error, and every rule H1-H9 has a vector."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from packer import errors
from packer import format as fmt
from packer.duplicates.sidecar import encode_hashes, file_size, parse_hashes

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "formats" / "vectors" / "hashes"
EXPECTED = json.loads((VECTORS / "expected.json").read_text("utf-8"))


def test_the_valid_file_reads_to_its_values() -> None:
    valid = EXPECTED["valid"]
    data = (VECTORS / valid["file"]).read_bytes()
    table = parse_hashes(data, index_checksum=int(valid["index_checksum"], 16), sample_count=valid["sample_count"])
    assert [[f"{int(w):016x}" for w in row] for row in table.hashes] == valid["hashes"]
    assert table.status.tolist() == valid["status"]
    assert len(data) == file_size(valid["sample_count"]) and data[:8] == fmt.HASHES_MAGIC
    assert encode_hashes(table, int(valid["index_checksum"], 16)) == data  # the writer's bytes, exactly


@pytest.mark.parametrize("name", sorted(EXPECTED["invalid"]))
def test_each_damaged_file_fails_with_its_error(name: str) -> None:
    case = EXPECTED["invalid"][name]
    data = (VECTORS / case["file"]).read_bytes()
    with pytest.raises(getattr(errors, case["error"])) as caught:
        parse_hashes(data, path="x.pkh", index_checksum=int(case["index_checksum"], 16),
                     sample_count=case["sample_count"])
    assert type(caught.value).__name__ == case["error"]
    assert case["message"] in str(caught.value) and str(caught.value).startswith("x.pkh")


def test_every_rule_of_section_16_has_a_vector() -> None:
    spec = (REPO / "formats" / "SPEC.md").read_text("utf-8")
    rules = set(re.findall(r"^\| (H\d+) \|", spec, flags=re.M))
    assert rules == {f"H{n}" for n in range(1, 10)}
    assert {case["requirement"] for case in EXPECTED["invalid"].values()} == rules
    code = (REPO / "packer" / "duplicates" / "sidecar.py").read_text("utf-8")
    assert set(re.findall(r"# \[(H\d+)\]", code)) == rules  # each rule tagged where it is checked


def test_random_damage_is_refused_or_harmless() -> None:
    """Flip, cut or extend a valid file anywhere: a typed error, or (reserved bytes) the same table."""
    valid = (VECTORS / EXPECTED["valid"]["file"]).read_bytes()
    reference = parse_hashes(valid)
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
            table = parse_hashes(bytes(data))
        except errors.FormatError:
            continue
        assert np.array_equal(table.hashes, reference.hashes) and np.array_equal(table.status, reference.status)
