"""The object-storage guide's local recipe runs as written (issue 39): moto's S3 server on
127.0.0.1, the bucket made, a build, inspect, verify and a read through a URL, the node cache where
``PACKER_CACHE_DIR`` says. The docs test skips the block (it starts a server); this runs it, on a
free port instead of 9000."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import packer_on_path, write_images

REPO = Path(__file__).resolve().parents[2]


def _recipe() -> str:
    sys.path.insert(0, str(REPO / "tests" / "project"))
    import test_docs

    blocks = test_docs.readme_blocks((REPO / "docs" / "guides" / "object-storage.md").read_text(encoding="utf-8"))
    found = [block.code for block in blocks if "moto_server" in block.code]
    assert len(found) == 1, "the guide's local recipe (a block starting moto_server) is gone"
    return found[0]


@pytest.mark.timeout(240)
def test_the_local_recipe_runs(tmp_path):
    if shutil.which("moto_server", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")) \
            is None:
        pytest.skip("moto_server is not installed (the dev extra)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = _recipe()
    assert "127.0.0.1:9000" in code and "-H 127.0.0.1" in code  # the recipe itself stays on loopback
    code = code.replace("9000", str(port))
    write_images(tmp_path / "images", {"cat": 4, "dog": 3})
    env = packer_on_path(tmp_path)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    for name in [n for n in env if n.startswith(("AWS_", "GOOGLE_", "AZURE_"))]:
        env.pop(name)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    process = subprocess.Popen(["bash", "-e", "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=200)
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)  # the server, should the block have stopped early
        except ProcessLookupError:
            pass
    assert process.returncode == 0, out + err
    assert "7 samples, " in out, out
    assert any((tmp_path / "packer-cache" / "v1").iterdir())
