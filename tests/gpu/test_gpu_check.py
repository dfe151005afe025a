"""scripts/gpu_check.py: the dry run exercises every section host-side, and the check fails loudly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import gpu_check  # noqa: E402  (scripts/ is on sys.path: see conftest.py)

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ["environment", "pytest -m gpu", "datasets", "block reads", "raw batches", "raw batch crops", "jpeg decode",
            "multi-gpu", "failure injection", "dali mixed", "tiled nvjpeg", "raw crop"]


def test_dry_run_exercises_every_section(tmp_path: Path) -> None:
    # A subprocess: the dry run installs a fake kvikio into packer.backends.kvikio.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("OUT", None)
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--dry-run", "--work",
                           str(tmp_path / "work"), "--json", str(out)], capture_output=True, text=True, env=env,
                          timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert sorted(results["sections"]) == sorted(SECTIONS)
    try:
        import nvidia.dali  # noqa: F401
        dali = True
    except Exception:  # noqa: BLE001
        dali = False
    for name in SECTIONS:
        status = results["sections"][name]["status"]
        if name == "dali mixed" and not dali:
            assert status == "not run" and "DALI missing" in results["sections"][name]["why"]
        else:
            assert status == "ok", (name, results["sections"][name])
    assert results["sections"]["failure injection"]["result"] == {"started": 3, "waited": 2}
    counts = results["sections"]["jpeg decode"]["result"]["gpu_decode_counts"]
    assert counts["gpu"] > 0 and counts["cpu_fallback"] == 0
    assert len(results["sections"]["multi-gpu"]["result"]["ranks"]) == 2
    assert "check passed" in proc.stdout and "section" in results["table"]


def test_pytest_verdict_fails_on_skips_only_on_a_gpu_machine() -> None:
    assert gpu_check.pytest_verdict("4 passed, 700 deselected in 9.1s", 0, gpu=True) == "ok"
    assert "skipped on a GPU machine" in gpu_check.pytest_verdict("3 passed, 1 skipped in 2s", 0, gpu=True)
    assert gpu_check.pytest_verdict("4 skipped, 40 deselected in 1s", 0, gpu=False) == "ok"
    assert "exited 1" in gpu_check.pytest_verdict("1 failed, 3 passed", 1, gpu=True)
    assert "no gpu test passed" in gpu_check.pytest_verdict("700 deselected", 0, gpu=True)
    assert "timed out" in gpu_check.pytest_verdict("", "timeout", gpu=True)


def test_nvjpeg_and_gds_verdicts() -> None:
    assert gpu_check.nvjpeg_verdict({"gpu": 10, "cpu_fallback": 0, "cpu": 3}) == "ok"
    assert "refused 2" in gpu_check.nvjpeg_verdict({"gpu": 8, "cpu_fallback": 2, "cpu": 0})
    assert "decoded nothing" in gpu_check.nvjpeg_verdict({"gpu": 0, "cpu_fallback": 10, "cpu": 0})
    rows = [{"block": 1 << 20, "ratio": 3.0}, {"block": 4 << 20, "ratio": 1.5}, {"block": 16 << 20, "ratio": 1.3}]
    possible = {"gds_possible": True}
    assert "consistent with GDS" in gpu_check.gds_verdict(possible, rows)
    assert "no GDS advantage" in gpu_check.gds_verdict(possible, rows + [{"block": 64 << 20, "ratio": 1.0}])
    assert gpu_check.gds_verdict({"gds_possible": False, "requested_mode": "ON"}, rows).startswith("GDS not possible")
    assert gpu_check.gds_verdict(possible, []).startswith("not measured")


def test_sections_record_failures_and_not_run_loudly() -> None:
    gpu_check.RESULTS.update({"sections": {}, "errors": [], "not_run": {}})

    def fails() -> None:
        raise gpu_check.CheckFailed("nvJPEG decoded nothing")

    def missing() -> None:
        raise gpu_check.NotRun("DALI missing")

    gpu_check.section("a", 1e9, 0)(fails)
    gpu_check.section("b", 1e9, 0)(missing)
    gpu_check.section("c", -1e9, 1)(lambda: None)  # out of time: a failure, not a silent skip
    sections = gpu_check.RESULTS["sections"]
    assert sections["a"]["status"] == "fail" and "nvJPEG" in sections["a"]["error"]
    assert sections["b"] == {"status": "not run", "why": "DALI missing"}
    assert sections["c"]["status"] == "fail" and "time budget" in sections["c"]["error"]
    assert [e["section"] for e in gpu_check.RESULTS["errors"]] == ["a", "c"]
    table = gpu_check.table()
    assert "not run: DALI missing" in table and "check FAILED" in table
    gpu_check.RESULTS.update({"sections": {}, "errors": [], "not_run": {}})
