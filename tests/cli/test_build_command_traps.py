"""``packer build`` says what to do next and what it did, once: the Ctrl-C hint, the split build's
option mismatch (a usage error, the differing options only), a missing Ray found before any work,
the split-folder warning printed once, and the tiled codec counting what it stored unchanged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from helpers import write_images
from packer.cli import _register, cli
from packer.errors import MissingDependencyError
from packer.writer import BuildSettings, RunOptions, build
from packer.writer.staging import STAGING_DIR

_register()


def _run(*args: object) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def source(tmp_path: Path) -> Path:
    write_images(tmp_path / "src", {"cat": 4, "dog": 3})
    return tmp_path / "src"


@pytest.mark.parametrize("extra, hint", [
    ((), "interrupted; run the same command with --resume to continue (finished shards are kept)"),
    (("--part", "1/2"), "interrupted; run the same --part 1/2 command again (its finished shards are kept)"),
])
def test_ctrl_c_in_a_build_says_how_to_continue(source: Path, tmp_path: Path, monkeypatch, extra, hint) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("packer.writer.run.build", interrupted)
    result = _run("build", source, tmp_path / "out", *extra)
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines() == [hint]


def test_a_part_with_other_options_is_a_usage_error_naming_only_what_differs(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run("build", source, out, "--part", "0/2", "--shard-size", "8K", "--seed", "1").exit_code == 0
    result = _run("build", source, out, "--part", "1/2", "--shard-size", "8K", "--seed", "2")
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert "--seed: saved 1, asked 2" in message  # named as the user typed it
    assert "--resume" not in message and "shard" not in message and "{" not in message
    assert "--part reuses its saved plan" in message


def test_resume_with_other_options_names_what_differs(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run("build", source, out, "--plan-only", "--shard-size", "8K").exit_code == 0
    result = _run("build", source, out, "--resume", "--shard-size", "16K")
    assert result.exit_code == 2
    assert "--shard-size: saved 8192, asked 16384" in result.stderr
    assert "use the same options with --resume" in result.stderr


def test_engine_ray_without_ray_fails_before_any_work(source: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    out = tmp_path / "out"
    with pytest.raises(MissingDependencyError, match=r"pip install 'packer-shards\[ray\]'"):
        build(source, out, BuildSettings(), RunOptions(engine="ray"))
    assert not out.exists()  # no .packer-build, no lock file, no folder
    result = _run("build", source, out, "--engine", "ray")
    assert result.exit_code == 3 and "--engine ray needs Ray" in result.stderr
    assert not (out / STAGING_DIR).exists()


def test_the_split_folder_warning_is_printed_once(tmp_path: Path) -> None:
    write_images(tmp_path / "src", {"train": 3, "val": 2})
    result = _run("build", tmp_path / "src", tmp_path / "out", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("look like dataset splits") == 1
    assert len(json.loads(result.stdout)["warnings"]) == 1


def test_the_tiled_summary_counts_the_images_it_stored_unchanged(tmp_path: Path) -> None:
    pytest.importorskip("packer.codecs._jpegtiles")
    root = tmp_path / "src"
    write_images(root, {"cat": 3})
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(root / "cat" / f"p{i}.png")
    result = _run("build", root, tmp_path / "out", "--codec", "tiled", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["codec_notes"] == {"kept: not a JPEG (png)": 2, "tiled": 3}
    assert "codec: 2 kept: not a JPEG (png), 3 tiled" in result.stderr
