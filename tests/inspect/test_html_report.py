"""``packer inspect --html``: the self-contained report, its escaping, and how a browser renders it.

The browser checks open the page in headless Chromium (Debian's ``chromium``; ``make test``
installs it) and fail on any console message (a script error, a refused fetch under the page's
Content-Security-Policy) or a DOM without the report's sections. Without Chromium they skip,
unless ``PACKER_REQUIRE_BROWSER=1`` (set by ``make test``) makes its absence a failure.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import packer.cli.inspect_cmd  # noqa: F401  (registers the inspect command)
from packer.cli import cli
from packer.dataset import open_index
from packer.inspect.report_html import CONTENT_SECURITY_POLICY, render_html, report_arrays
from packer.inspect.summary import summarize
from packer.inspect.svg import bar_chart, bin_counts, histogram, line_chart, text
from packer.writer import build
from packer.writer.plan import BuildOptions

from helpers import run_chromium

#: Class folder names a hostile source could hold: markup, an attribute break-out, a bidi override.
HOSTILE = ("<script>alert(1)<", "<img src=x onerror=alert(2)>", "q\"uote' & amp", "dog\u202eevil")


def make_source(root: Path) -> Path:
    rng = np.random.default_rng(5)
    for n, name in enumerate(("cat", *HOSTILE)):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(3 + n):
            pixels = rng.integers(0, 256, (24 + 4 * i, 32 + 2 * n, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.{'png' if i % 2 else 'jpg'}")
    (root / "cat" / "empty.jpg").write_bytes(b"")
    (root / HOSTILE[0] / "<i onmouseover=x>.jpg").write_bytes(b"<html>not an image</html>")
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("html")
    out = tmp / "ds"
    build(make_source(tmp / "src"), out, BuildOptions(shard_size=16 << 10, seed=1), workers=1, progress=False)
    return out


def write_report(dataset: Path, out: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(cli, ["inspect", str(dataset), "--html", str(out), "--json", *args])
    return result.exit_code, json.loads(result.stdout)


# --- the page itself ----------------------------------------------------------------------------

def test_svg_text_escapes_markup_quotes_and_invisible_characters() -> None:
    assert text("<script>a & 'b' \"c\"") == "&lt;script&gt;a &amp; &#x27;b&#x27; &quot;c&quot;"
    assert text("dog\u202eevil\n\x00") == "dog\\u202eevil\\u000a\\u0000"
    assert text("ab\udcffc") == "ab\\udcffc"  # a lone surrogate (an escaped file name) is shown, never encoded
    assert text("x" * 50, limit=10) == "x" * 10 + "\u2026"


def test_charts_carry_labels_only_as_escaped_text() -> None:
    bars = bar_chart([("<script>", 3), ("ok", 0)], title="<t>", unit=" B")
    assert "<script>" not in bars and bars.count("&lt;script&gt;") == 1 and "&lt;t&gt;" in bars
    counts, edges = bin_counts(np.array([1, 2, 2, 3, np.nan, np.inf]), bins=2)
    assert counts == [1, 3] and edges == [1.0, 2.0, 3.0]
    assert bin_counts(np.array([np.nan])) == ([], [])
    assert "no values" in histogram([], [], title="t", xlabel="x")
    chart = line_chart({"<a>": [(0, 1.0), (2, 3.0)]}, title="t", xlabel="workers", ylabel="images/s")
    assert chart.count("<circle") == 2 and "&lt;a&gt;" in chart and "<a>" not in chart


def test_report_arrays_add_up_to_the_summary(dataset: Path) -> None:
    summary = summarize(dataset)
    with open_index(dataset) as index:
        arrays = report_arrays(index)
        assert sum(arrays["sample_bytes"][0]) == len(index)
        assert sum(arrays["width"][0]) == int(np.count_nonzero(index.index.width))
    assert sum(arrays["padding_per_shard"]) == summary["bytes"]["padding"]
    assert sum(arrays["shard_bytes"][0]) == summary["shards"]["count"] > 1


def test_html_report_holds_every_section_and_escapes_hostile_names(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    code, document = write_report(dataset, out)
    assert code == 0 and document["html"] == {"path": str(out), "bytes": out.stat().st_size, "verified": False,
                                              "verify_ok": None}
    page = out.read_text("utf-8")
    for section in ("verify", "overview", "classes", "images", "shards", "rejected", "sheet", "build"):
        assert f'<section id="{section}">' in page
    assert "Verify did not run" in page
    assert f'content="{CONTENT_SECURITY_POLICY}"' in page
    # nothing executable, nothing fetched: no script element, no handler, every image a data URI
    assert not re.search(r"<script", page, re.IGNORECASE)
    assert not re.search(r"<[^>]*\son\w+=", page)
    assert re.findall(r'<img [^>]*src="([a-z]+):', page) == ["data"]
    assert not re.search(r"(src|href)=\"(https?:|//)", page)
    assert "&lt;script&gt;alert(1)&lt;" in page and "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "dog\\u202eevil" in page and "\u202e" not in page
    assert "q&quot;uote&#x27; &amp; amp" in page
    assert "&lt;i onmouseover=x&gt;.jpg" in page  # the rejected file's key, among the examples
    assert "not-an-image" in page and "empty-file" in page


def test_html_report_with_verify_says_ok_or_damaged(dataset: Path, tmp_path: Path) -> None:
    code, document = write_report(dataset, tmp_path / "ok.html", "--verify")
    assert code == 0 and document["html"]["verified"] and document["html"]["verify_ok"]
    assert "Verify ran: OK" in (tmp_path / "ok.html").read_text("utf-8")

    damaged = tmp_path / "damaged"
    shutil.copytree(dataset, damaged)
    with open_index(damaged) as index:
        shard = damaged / index.manifest.shards[0].path
        offset = int(index.index.offset[0])
    data = bytearray(shard.read_bytes())
    data[offset + 10] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, document = write_report(damaged, tmp_path / "bad.html", "--verify")
    assert code == 1 and document["ok"] is False and document["html"]["verify_ok"] is False
    page = (tmp_path / "bad.html").read_text("utf-8")
    assert "Verify ran: DAMAGED" in page and "checksum" in page
    # the shard's own checksum row has no sample and no key: empty cells, never the word None
    rows = re.findall(r"<tr>(<td>.*?)</tr>", page[page.index('id="verify"'):page.index("</section>")], re.S)
    assert any("shard-checksum" in row and "<td>0</td><td></td><td></td>" in row for row in rows), rows
    assert not any("<td>None</td>" in row for row in rows), rows


def test_html_option_errors(dataset: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["inspect", str(dataset), "--verify"])
    assert result.exit_code == 2 and "--verify" in result.output and "--html" in result.output
    out = tmp_path / "exists.html"
    out.write_text("keep")
    result = runner.invoke(cli, ["inspect", str(dataset), "--html", str(out)])
    assert result.exit_code == 2 and "already exists" in result.output and out.read_text() == "keep"
    result = runner.invoke(cli, ["inspect", str(dataset), "--html", str(out), "--force"])
    assert result.exit_code == 0 and out.read_text("utf-8").startswith("<!DOCTYPE html>")


def test_render_html_lists_verify_problems_escaped(dataset: Path) -> None:
    summary = summarize(dataset)
    with open_index(dataset) as index:
        arrays = report_arrays(index)
    problem = {"kind": "checksum", "shard": 0, "sample": 3, "key": "<script>x</script>.jpg",
               "message": "payload checksum <mismatch>", "path": None, "field": None, "sample_range": None}
    verify = {"ok": False, "samples": 9, "shards": 2, "samples_checked": 9, "shards_checked": 2,
              "bytes_read": 4096, "seconds": 0.5, "decoded": False, "damaged_sample_count": 1,
              "problems": [problem] * 201}
    page = render_html(summary, arrays, verify=verify, sheet_error="<no sheet>")
    assert "Verify ran: DAMAGED. 201 problem(s), 1 damaged sample(s)" in page
    assert page.count("&lt;script&gt;x&lt;/script&gt;.jpg") == 200 and "1 more problems" in page
    assert "payload checksum &lt;mismatch&gt;" in page and "Not drawn: &lt;no sheet&gt;" in page
    assert "<script" not in page


# --- in a browser -------------------------------------------------------------------------------

def test_chromium_reports_console_errors_so_the_check_can_fail(tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text(f'<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
                      f'content="{CONTENT_SECURITY_POLICY}"></head><body><script>boom()</script>'
                      '<img src="http://127.0.0.1:9/x.png"></body></html>')
    _, console = run_chromium(broken, tmp_path / "profile", "--dump-dom")
    assert console and any("Content Security Policy" in line or "Refused" in line for line in console)


def test_report_renders_in_chromium_without_errors(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert write_report(dataset, out, "--verify")[0] == 0
    dom, console = run_chromium(out, tmp_path / "profile-dom", "--dump-dom")
    assert console == []
    for section in ("verify", "classes", "images", "shards", "rejected", "sheet"):
        assert f'id="{section}"' in dom
    assert "<script" not in dom.lower()  # the hostile class names stayed text
    assert "&lt;script&gt;alert(1)&lt;" in dom and dom.count("<svg") >= 6
    shot = tmp_path / "shot.png"
    _, console = run_chromium(out, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1000,1400",
                              "--hide-scrollbars")
    assert console == []
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape == (1400, 1000, 3)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # text, charts and the verify banner drawn
