"""``inspect --sample`` on a sample whose stored field value cannot be decoded (issue 25): a caption
that is not UTF-8. It shows the value escaped and says what is wrong,
in text and JSON, instead of a KeyError traceback (other damaged values are refused when the index
is opened)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from packer.cli import _register, cli
from packer.writer import BuildOptions, build
from helpers import FIELDS, make_field_source, rewrite_index


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inspect-damaged")
    build(make_field_source(root / "src", count=3), root / "ds", BuildOptions(fields=FIELDS, shuffle=False),
          workers=1, progress=False)
    return root / "ds"


def _caption_bytes(columns: dict[str, np.ndarray], value: bytes) -> None:
    """Sample 0's caption becomes ``value`` (the other captions keep their bytes)."""
    offsets = columns["f_caption__offsets"].astype(np.int64)
    blob = columns["f_caption"].tobytes()
    rest = blob[int(offsets[1]):]
    columns["f_caption"] = np.frombuffer(value + rest, dtype=np.uint8).copy()
    columns["f_caption__offsets"] = (offsets - int(offsets[1]) + len(value)).astype(np.uint64)
    columns["f_caption__offsets"][0] = 0


def test_inspect_sample_shows_a_caption_that_is_not_utf8_escaped(built: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "ds"
    shutil.copytree(built, damaged)
    rewrite_index(damaged, lambda columns: _caption_bytes(columns, b"caf\xe9 \xff"))
    _register()
    text = CliRunner().invoke(cli, ["inspect", str(damaged), "--sample", "0"])
    assert text.exit_code == 0, text.output
    line = next(row for row in text.stdout.splitlines() if row.startswith("caption"))
    assert "not valid UTF-8" in line or "UTF-8" in line
    assert "caf\\\\xe9 \\\\xff" in line  # the bytes, escaped (JSON-quoted backslashes)
    as_json = CliRunner().invoke(cli, ["inspect", str(damaged), "--sample", "0", "--json"])
    assert as_json.exit_code == 0, as_json.output
    caption = json.loads(as_json.stdout)["sample"]["fields"]["caption"]
    assert caption["escaped"] == "caf\\xe9 \\xff" and "UTF-8" in caption["error"]
    other = CliRunner().invoke(cli, ["inspect", str(damaged), "--sample", "1"])
    assert other.exit_code == 0 and "a photo number 1" in other.stdout
