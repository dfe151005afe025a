"""A bounded run of scripts/fuzz_sources.py in CI: every structure-aware hostile source packs into a
dataset that opens, or is refused with a PackerError; never another exception, a hang or unbounded
memory. The run prints its counts (``source fuzzing: {...}``, read by scripts/reliability_report.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECONDS = 20


@pytest.mark.timeout(240)
def test_structure_aware_fuzzing_finds_no_untyped_ending(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "fuzz_sources.py"), "--seconds", str(SECONDS),
                           "--seed", "25", "--keep", str(tmp_path / "failures"), "--case-seconds", "60"],
                          capture_output=True, text=True, timeout=200, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # this checkout's packer, not an install
    summary_line = [line for line in done.stdout.splitlines() if line.startswith("source fuzzing: ")]
    assert summary_line, done.stdout + done.stderr
    print(summary_line[-1])  # the reliability report reads it (pytest -s)
    summary = json.loads(summary_line[-1].split(": ", 1)[1])
    assert done.returncode == 0 and summary["failures"] == 0, done.stderr[-4000:]
    assert set(summary["by_kind"]) == {"tar", "zip", "webdataset", "parquet", "coco"}
    assert summary["cases"] >= 50
    # the generators reach both endings for every kind: hostile enough to be refused, sound enough to pack
    for kind, outcomes in summary["outcomes_by_kind"].items():
        assert outcomes.get("packed", 0) > 0 and sum(outcomes.values()) > outcomes.get("packed", 0), (kind, outcomes)


def test_the_fuzzer_reports_an_untyped_ending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness can fail: a door that raises something other than a PackerError is a failure, kept."""
    import fuzz_sources

    from packer.sources import zip as zip_door

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise IndexError("a door that trips on its input")

    monkeypatch.setattr(zip_door, "list_zip", broken)
    monkeypatch.setattr("packer.sources.detect.list_zip", broken)
    report = fuzz_sources.fuzz(60, seed=3, kinds=("zip",), keep=tmp_path / "kept", max_cases=15)
    assert report.failures and all("IndexError" in failure["error"] for failure in report.failures)
    assert all((Path(failure["kept"]) / "traceback.txt").is_file() for failure in report.failures)
