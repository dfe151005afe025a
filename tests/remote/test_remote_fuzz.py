"""A bounded run of the remote-server fuzzer (``scripts/fuzz_sources.py --kinds remote``) in CI: the
loopback S3 server's answers mutated at random (flipped, zeroed, cut, extended, whole objects for a
range, lying headers, error statuses, the manifest too), and every whole-dataset read through
packer gives the folder's bytes or a PackerError. The run prints its counts (``source fuzzing:``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_mutated_answers_give_the_same_bytes_or_a_typed_error(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in [n for n in env if n.startswith(("AWS_", "GOOGLE_", "AZURE_"))]:
        env.pop(name)  # the fuzzer sets dummy credentials for its loopback server, nothing else
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "fuzz_sources.py"), "--kinds", "remote",
                           "--seconds", "25", "--seed", "38", "--keep", str(tmp_path / "failures"),
                           "--case-seconds", "60"], capture_output=True, text=True, timeout=280, cwd=REPO, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("source fuzzing: ")]
    assert lines, done.stdout + done.stderr[-4000:]
    print(lines[-1])
    summary = json.loads(lines[-1].split(": ", 1)[1])
    assert done.returncode == 0 and summary["failures"] == 0, done.stderr[-4000:]
    outcomes = summary["outcomes"]
    assert summary["cases"] >= 10 and outcomes.get("identical", 0) > 0 and len(outcomes) > 1, outcomes
