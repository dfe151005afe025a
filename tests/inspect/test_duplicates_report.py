"""``packer inspect --duplicates``: the JSON document, the exit codes, the text, and the HTML
section of pairs side by side, escaped and script-free, looked at in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from helpers import encode, near_copy, photo_like
from test_html_report import run_chromium

import packer.cli.inspect_cmd  # noqa: F401  (registers the inspect command)
from packer.cli import cli
from packer.inspect.report_html import CONTENT_SECURITY_POLICY
from packer.writer import build
from packer.writer.plan import BuildOptions

HOSTILE_KEY = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def splits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dups-cli")
    photos = [photo_like(seed) for seed in range(8)]
    for split in ("train", "val"):
        (root / split / "<b>cls").mkdir(parents=True)
    for number in range(6):
        (root / "train" / "<b>cls" / f"p{number}.jpg").write_bytes(encode(photos[number]))
    shutil.copy(root / "train" / "<b>cls" / "p0.jpg", root / "train" / "<b>cls" / "again.jpg")
    (root / "val" / "<b>cls" / f"{HOSTILE_KEY}.jpg").write_bytes(near_copy(photos[1], "quality", 1))
    (root / "val" / "<b>cls" / "crop.jpg").write_bytes(near_copy(photos[2], "crop", 2))
    (root / "val" / "<b>cls" / "new.jpg").write_bytes(encode(photos[7]))
    out = {}
    for split in ("train", "val"):
        out[split] = root / "ds" / split
        build(root / split, out[split], BuildOptions(shard_size=1 << 20, seed=1), workers=1, progress=False)
    return out


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["inspect", *args])
    return result.exit_code, result.stdout, result.stderr


def test_json_is_one_sorted_document_and_a_leak_exits_1(splits: dict[str, Path]) -> None:
    code, out, _ = invoke(str(splits["train"]), "--duplicates", "--against", str(splits["val"]), "--json")
    assert code == 1
    document = json.loads(out)
    assert out == json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert document["format_version"] == 1 and document["ok"] is False  # a leak: not ok, exit 1
    found = document["duplicates"]
    assert found["version"] == 1 and found["algorithm"] == "dct-sign-128" and found["threshold"] == 20
    assert [d["name"] for d in found["datasets"]] == ["train", "val"]
    assert found["counts"]["leaks"] == {"groups": 2, "samples": {"train": 2, "val": 2}}
    assert [g["leak"] for g in found["groups"]] == [True, True, False]
    keys = {m["key"] for g in found["groups"] for m in g["members"]}
    assert f"<b>cls/{HOSTILE_KEY}.jpg" in keys and "<b>cls/again.jpg" in keys
    assert all(p["distance"] <= 20 for g in found["groups"] for p in g["pairs"])
    assert found["datasets"][0]["hashes"] == {"hashed": 7, "flat": 0, "unreadable": 0}


def test_without_a_leak_it_exits_0_and_the_text_names_the_groups(splits: dict[str, Path]) -> None:
    from packer.duplicates import DEFAULT_THRESHOLD

    code, out, _ = invoke(str(splits["train"]), "--duplicates")
    assert code == 0
    assert "exact: 1 group(s), 1 pair(s), 2 sample(s)" in out and "train[" in out and "again.jpg" in out
    code, out, _ = invoke(str(splits["train"]), "--duplicates", "--against", str(splits["val"]), "--threshold", "6")
    assert code == 1 and "near: perceptual hashes within 6 of 128 bits" in out  # the re-encoded copy is close
    help_text = " ".join(CliRunner().invoke(cli, ["inspect", "--help"]).output.split())
    assert f"(default {DEFAULT_THRESHOLD})" in help_text  # the help states the library's default


@pytest.mark.parametrize("args, message", [
    (["--against", "{val}"], "they need --duplicates"),
    (["--threshold", "4"], "they need --duplicates"),
    (["--flips"], "they need --duplicates"),
    (["--duplicates", "--threshold", "129"], "129 is not in the range 0<=x<=128"),
    (["--duplicates", "--against", "{missing}"], "does not exist"),
])
def test_usage_errors_exit_2(splits: dict[str, Path], tmp_path: Path, args: list[str], message: str) -> None:
    args = [a.format(val=splits["val"], missing=tmp_path / "missing") for a in args]
    result = CliRunner().invoke(cli, ["inspect", str(splits["train"]), *args])
    assert result.exit_code == 2 and message in result.output


def test_html_shows_each_pair_side_by_side_escaped_and_without_script(splits: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    code, stdout, _ = invoke(str(splits["train"]), "--duplicates", "--against", str(splits["val"]), "--html",
                             str(out), "--json")
    assert code == 1 and json.loads(stdout)["html"]["path"] == str(out)
    page = out.read_text("utf-8")
    section = page[page.index('<section id="duplicates">'):]
    section = section[:section.index("</section>")]
    assert section.count('class="pair"') == 3 and section.count("<figure>") == 6
    assert "identical bytes" in section and "leak, near" in section
    assert re.findall(r'<img [^>]*src="([a-z]+):', section) == ["data"] * 6
    assert "&lt;img src=x onerror=alert(1)&gt;" in section and HOSTILE_KEY not in page
    assert "&lt;b&gt;cls" in section and "<b>cls" not in page
    assert not re.search(r"<script", page, re.IGNORECASE) and not re.search(r"<[^>]*\son\w+=", page)
    assert f'content="{CONTENT_SECURITY_POLICY}"' in page

    dom, console = run_chromium(out, tmp_path / "profile-dom", "--dump-dom")
    assert console == []
    assert 'id="duplicates"' in dom and dom.count('class="pair"') == 3 and "<script" not in dom.lower()
    shot = tmp_path / "shot.png"
    _, console = run_chromium(out, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1000,1400",
                              "--hide-scrollbars")
    assert console == []
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 500  # the thumbnails were drawn, not blank


def test_an_html_report_that_exists_is_refused_before_the_search(splits: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    out.write_text("mine")
    result = CliRunner().invoke(cli, ["inspect", str(splits["train"]), "--duplicates", "--html", str(out)])
    assert result.exit_code != 0 and out.read_text() == "mine"
    assert f"{out}: already exists; pass --force to overwrite it" in result.output


def test_a_damaged_sample_of_a_pair_is_shown_as_not_decodable(splits: dict[str, Path], tmp_path: Path) -> None:
    """The pair is found from the hashes kept beside the index; the sample's bytes were damaged
    afterwards: its thumbnail says so instead of showing whatever the damaged bytes decode to."""
    val = tmp_path / "val"
    shutil.copytree(splits["val"], val)
    assert invoke(str(splits["train"]), "--duplicates", "--against", str(val))[0] == 1  # hashes saved beside val
    with packer.open_dataset(val) as ds:
        number = next(i for i in range(len(ds)) if ds.key(i).endswith(f"{HOSTILE_KEY}.jpg"))
        shard = val / ds.manifest.shards[int(ds.index.shard[number])].path
        where = int(ds.index.offset[number]) + int(ds.index.size[number]) // 2
    with open(shard, "r+b") as handle:
        handle.seek(where)
        byte = handle.read(1)
        handle.seek(where)
        handle.write(bytes([byte[0] ^ 0xFF]))
    out = tmp_path / "report.html"
    code, _, _ = invoke(str(splits["train"]), "--duplicates", "--against", str(val), "--html", str(out))
    assert code == 1
    section = out.read_text("utf-8").split('<section id="duplicates">')[1].split("</section>")[0]
    assert section.count('class="nothumb">not decodable<') == 1 and section.count("<figure>") == 6
