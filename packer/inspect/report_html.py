"""``inspect --html``: one self-contained HTML page about a dataset, for people rather than pipes.

The page shows what ``packer inspect`` prints, as plots where a plot reads faster: samples per
class, image widths and heights, bytes per sample, shard sizes and their padding, rejected files
by reason with examples, the declared fields, the contact sheet and the verify status (whether
verify ran, and what it found).

It needs nothing at view time: charts are inline SVG (``packer.inspect.svg``), the contact sheet
a PNG ``data:`` URI, the style one ``<style>`` element; there is no script at all, and a
Content-Security-Policy forbids scripts and every fetch, so the page can be mailed, archived
or opened offline. Every stored string (keys, class names, messages, build options) is data and
is escaped (``svg.text``): a class named ``<script>`` is shown, never run.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from .._version import __version__
from .. import format as fmt
from .duplicates import STYLE as _DUPLICATES_STYLE
from .fields import format_fields
from .summary import build_settings_rows
from .svg import MAX_BARS, bar_chart, bin_counts, histogram, text

__all__ = ["report_arrays", "render_html", "REJECTED_EXAMPLES", "REJECTED_READ", "CONTENT_SECURITY_POLICY"]

#: Examples shown per rejection reason.
REJECTED_EXAMPLES = 5
#: Entries of build-report.jsonl read for the examples (all of them are counted by reason).
REJECTED_READ = 2000
#: Scripts, frames, fonts and fetches are all refused; images only from data: URIs.
CONTENT_SECURITY_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
#: Problems of a verify run listed one by one (the count is always given).
_PROBLEMS_SHOWN = 200
_CHUNK = 1 << 22

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.path { font-family: monospace; color: #555; word-break: break-all; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { padding: 2px 10px; text-align: left;
  vertical-align: top; border-bottom: 1px solid #eee; } th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.status { padding: 0.8em 1em; border-radius: 6px; margin: 1em 0; font-weight: bold; }
.ok { background: #e3f4e6; border: 1px solid #5aa469; } .bad { background: #fbe4e4; border: 1px solid #c0392b; }
.unknown { background: #fff6d8; border: 1px solid #d4a017; }
.note { color: #555; font-size: 0.9em; } pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; }
svg { display: block; margin: 0.6em 0; max-width: 100%; height: auto; } img.sheet { max-width: 100%; }
code { font-family: monospace; }
"""


def report_arrays(index: Any) -> dict[str, Any]:
    """The binned numbers the report's plots need, from an open ``DatasetIndex`` (no shard read).

    Returns:
        ``{"width", "height", "sample_bytes", "shard_bytes", "shard_padding"}``: each a
        ``(counts, edges)`` pair from ``svg.bin_counts``; and ``"padding_per_shard"``, the padding
        bytes of each shard in manifest order (a list of ints).
    """
    ix = index.index
    manifest = index.manifest
    shards = len(manifest.shards)
    known = (ix.width > 0) & (ix.height > 0)
    payload = np.zeros(shards, dtype=np.int64)
    # per-shard payload sums in chunks: bincount's float64 weights of a 100 M-sample column at once
    # would be 800 MB
    for start in range(0, len(ix.size), _CHUNK):
        part_shard = np.asarray(ix.shard[start:start + _CHUNK], dtype=np.int64)
        part_size = np.asarray(ix.size[start:start + _CHUNK], dtype=np.float64)
        payload += np.rint(np.bincount(part_shard, weights=part_size, minlength=shards)).astype(np.int64)
    shard_sizes = np.array([entry.size for entry in manifest.shards], dtype=np.int64)
    padding = shard_sizes - fmt.shard_data_offset(manifest.alignment) - payload
    return {
        "width": bin_counts(ix.width[known]),
        "height": bin_counts(ix.height[known]),
        "sample_bytes": bin_counts(ix.size),
        "shard_bytes": bin_counts(shard_sizes),
        "shard_padding": bin_counts(padding),
        "padding_per_shard": padding.tolist(),
    }


def _size(n: float) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover


def _table(rows: list[tuple[str, Any]]) -> str:
    return "<table>" + "".join(f"<tr><th>{text(name)}</th><td>{text(value, 2000)}</td></tr>"
                               for name, value in rows) + "</table>"


def _cell(value: Any) -> str:
    """A problem's shard, sample or key: an empty cell where it has none (a whole shard's checksum
    names no sample), never the word None."""
    return "" if value is None else text(value)


def _verify_section(verify: dict[str, Any] | None) -> str:
    if verify is None:
        return ('<section id="verify"><div class="status unknown">Verify did not run for this report: '
                "the checksums were not checked. Run <code>packer verify DATASET</code>, or write the "
                "report with <code>packer inspect DATASET --html FILE --verify</code>.</div></section>")
    checked = (f"{verify['samples_checked']:,} of {verify['samples']:,} samples in {verify['shards_checked']:,} of "
               f"{verify['shards']:,} shard(s) checked" + (" and decoded" if verify.get("decoded") else ""))
    speed = f"{_size(verify['bytes_read'])} read in {verify['seconds']:.2f} s"
    if verify["ok"]:
        return (f'<section id="verify"><div class="status ok">Verify ran: OK. {text(checked)} '
                f"({text(speed)}); every checksum matched.</div></section>")
    problems = verify["problems"]
    rows = "".join(f"<tr><td>{text(p['kind'])}</td><td>{_cell(p.get('shard'))}</td>"
                   f"<td>{_cell(p.get('sample'))}</td><td>{_cell(p.get('key'))}</td>"
                   f"<td>{text(p['message'], 1000)}</td></tr>" for p in problems[:_PROBLEMS_SHOWN])
    more = (f'<p class="note">... {len(problems) - _PROBLEMS_SHOWN:,} more problems: run '
            "<code>packer verify DATASET</code>.</p>" if len(problems) > _PROBLEMS_SHOWN else "")
    return (f'<section id="verify"><div class="status bad">Verify ran: DAMAGED. {len(problems):,} problem(s), '
            f"{verify['damaged_sample_count']:,} damaged sample(s); {text(checked)}.</div>"
            "<table><tr><th>kind</th><th>shard</th><th>sample</th><th>key</th><th>what is wrong</th></tr>"
            f"{rows}</table>{more}</section>")


def _classes_section(summary: dict[str, Any]) -> str:
    classes = summary["classes"]
    parts = ['<section id="classes"><h2>Samples per class</h2>']
    if classes:
        if len(classes) <= MAX_BARS:
            parts.append(bar_chart([(c["name"], c["count"]) for c in classes], title="samples per class"))
        else:
            counts = np.array([c["count"] for c in classes], dtype=np.int64)
            parts.append(histogram(*bin_counts(counts), title=f"samples per class ({len(classes):,} classes)",
                                   xlabel="samples in a class"))
            ranked = sorted(classes, key=lambda c: (c["count"], c["label"]))
            parts.append(bar_chart([(c["name"], c["count"]) for c in ranked[:20]],
                                   title="the 20 smallest classes"))
            parts.append(bar_chart([(c["name"], c["count"]) for c in reversed(ranked[-20:])],
                                   title="the 20 largest classes"))
        empty = [c["name"] for c in classes if c["count"] == 0]
        if empty:
            parts.append(f'<p class="note">{len(empty):,} class(es) hold no sample: '
                         f"{text(', '.join(empty[:20]), 1000)}</p>")
    elif summary.get("labels"):
        labels = sorted(summary["labels"].items(), key=lambda item: -item[1])
        parts.append(bar_chart([(f"label {name}", count) for name, count in labels],
                               title=f"samples per integer label ({len(labels):,} labels, no class names)"))
    else:
        parts.append('<p class="note">No labels: the dataset is unlabeled.</p>')
    if summary["unlabeled"]:
        parts.append(f'<p class="note">{summary["unlabeled"]:,} sample(s) have no label (-1).</p>')
    parts.append("</section>")
    return "".join(parts)


def _images_section(summary: dict[str, Any], arrays: dict[str, Any]) -> str:
    images = summary["images"]
    parts = ['<section id="images"><h2>Image sizes and bytes per sample</h2>',
             histogram(*arrays["width"], title="image width", xlabel="pixels"),
             histogram(*arrays["height"], title="image height", xlabel="pixels"),
             histogram(*arrays["sample_bytes"], title="bytes per sample (stored payload)", xlabel="bytes")]
    if images["unknown_size"]:
        parts.append(f'<p class="note">Size unknown for {images["unknown_size"]:,} sample(s).</p>')
    parts.append(bar_chart(sorted(images["formats"].items(), key=lambda item: -item[1]), title="image formats"))
    parts.append(bar_chart([(f"{k} channel(s)", v) for k, v in images["channels"].items()], title="channels"))
    parts.append("</section>")
    return "".join(parts)


def _shards_section(summary: dict[str, Any], arrays: dict[str, Any]) -> str:
    b = summary["bytes"]
    padding = arrays["padding_per_shard"]
    parts = ['<section id="shards"><h2>Shards and padding</h2>',
             _table([("shards", f"{summary['shards']['count']:,}"), ("alignment", f"{summary['alignment']:,} bytes"),
                     ("payload", _size(b["payload"])), ("padding", _size(b["padding"])),
                     ("shard headers", _size(b["header"])),
                     ("overhead", f"{b['padding_overhead_percent']:.2f} % of the payload (padding and headers)"),
                     ("index", _size(b["index"])), ("total on disk", _size(b["total"]))])]
    if 0 < len(padding) <= MAX_BARS:
        parts.append(bar_chart([(f"shard {n}", size) for n, size in enumerate(padding)],
                               title="alignment padding per shard", unit=" B"))
    elif padding:
        parts.append(histogram(*arrays["shard_padding"], title="alignment padding per shard", xlabel="bytes"))
    parts.append(histogram(*arrays["shard_bytes"], title="shard sizes", xlabel="bytes"))
    parts.append("</section>")
    return "".join(parts)


def _rejected_section(rejected: dict[str, Any]) -> str:
    parts = ['<section id="rejected"><h2>Rejected files</h2>']
    if not rejected["available"]:
        parts.append('<p class="note">Unknown: the dataset has no build-report.jsonl.</p></section>')
        return "".join(parts)
    if not rejected["count"]:
        parts.append("<p>None: every source file was packed.</p></section>")
        return "".join(parts)
    by_reason = sorted(rejected["by_reason"].items(), key=lambda item: (-item[1], item[0]))
    parts.append(bar_chart(by_reason, title=f"{rejected['count']:,} rejected file(s) by reason"))
    examples: dict[str, list[dict[str, Any]]] = {}
    for entry in rejected["first"]:
        examples.setdefault(entry["reason"], [])
        if len(examples[entry["reason"]]) < REJECTED_EXAMPLES:
            examples[entry["reason"]].append(entry)
    parts.append("<table><tr><th>reason</th><th>count</th><th>examples (key: message)</th></tr>")
    for reason, count in by_reason:
        shown = "<br>".join(f"<code>{text(e['key'])}</code>: {text(e['message'])}" for e in examples.get(reason, []))
        parts.append(f'<tr><td>{text(reason)}</td><td class="num">{count:,}</td><td>{shown}</td></tr>')
    parts.append("</table>")
    if rejected["count"] > len(rejected["first"]):
        parts.append(f'<p class="note">Examples come from the first {len(rejected["first"]):,} entries; every '
                     "rejected file is listed in build-report.jsonl.</p>")
    parts.append("</section>")
    return "".join(parts)


def _sheet_section(sheet_png: bytes | None, sheet: dict[str, Any] | None, sheet_error: str | None) -> str:
    parts = ['<section id="sheet"><h2>Contact sheet</h2>']
    if sheet_png is None:
        parts.append(f'<p class="note">Not drawn: {text(sheet_error or "no samples")}</p></section>')
        return "".join(parts)
    data = base64.b64encode(sheet_png).decode("ascii")
    count = len(sheet["samples"]) if sheet else 0
    parts.append(f'<img class="sheet" alt="contact sheet of {count} samples" src="data:image/png;base64,{data}">')
    notes = []
    if sheet and sheet.get("failed"):
        notes.append(f"{len(sheet['failed'])} sample(s) could not be shown (grey tiles marked !)")
    if sheet and sheet.get("boxes"):
        notes.append(f"boxes of field {sheet['boxes']!r} outlined")
    if sheet and sheet.get("mask"):
        notes.append(f"masks of field {sheet['mask']!r} overlaid")
    parts.append(f'<p class="note">{count} samples drawn at random, decoded as a data loader would'
                 + (f"; {text('; '.join(notes))}" if notes else "") + ".</p></section>")
    return "".join(parts)


def render_html(summary: dict[str, Any], arrays: dict[str, Any], *, sheet_png: bytes | None = None,
                sheet: dict[str, Any] | None = None, sheet_error: str | None = None,
                verify: dict[str, Any] | None = None, duplicates: str | None = None) -> str:
    """The report page.

    Args:
        summary: ``packer.inspect.summary.summarize``'s result.
        arrays: ``report_arrays``' result for the same dataset.
        sheet_png: the contact sheet's PNG bytes, or None when it was not drawn.
        sheet: ``contact_sheet``'s result (which samples, overlays), when drawn.
        sheet_error: why the contact sheet was not drawn.
        verify: ``VerifyReport.to_json()`` when verify ran, None when it did not (the page says so).
        duplicates: the duplicates section (``packer.inspect.duplicates.duplicates_section``), when
            asked for (``--duplicates``).

    Returns:
        The whole HTML document as a string (UTF-8 when written).
    """
    s = summary
    classes = f"{len(s['classes']):,}" if s["classes"] else ("integer labels" if s.get("labels") else "none")
    codec = " ".join([str(s["codec"].get("name", "?"))] + [f"{k}={v}" for k, v in sorted(s["codec"].items())
                                                            if k != "name"])
    overview = _table([("samples", f"{s['samples']:,}"), ("shards", f"{s['shards']['count']:,}"),
                       ("classes", classes), ("total on disk", _size(s["bytes"]["total"])), ("codec", codec),
                       ("format version", s["dataset_format_version"]),
                       ("written by", s["created_by"] or "unknown"),
                       ("history", f"{len(s['history'])} generation(s)" if s["history"] else "one build")])
    fields = format_fields(s.get("fields") or [], one_line=lambda value: value)
    fields_html = (f'<section id="fields"><h2>Declared fields</h2><pre>{text(chr(10).join(fields), 100000)}</pre>'
                   "</section>" if fields else "")
    build = s["build"] if isinstance(s["build"], dict) else {}
    settings = fmt.recorded_build_settings(build) or {}  # nested, or the flat options of older builds
    build_rows = [(key, json.dumps(fmt.json_ready(value), sort_keys=True, ensure_ascii=False)[:500])
                  for key, value in build_settings_rows(settings)]
    notes = build.get("codec_notes")
    if isinstance(notes, dict) and notes:
        build_rows.append(("codec did", ", ".join(f"{n:,} {k}" for k, n in notes.items() if isinstance(n, int))))
    title = f"packer report: {s['path']}"
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{text(title, 300)}</title><style>{_STYLE}{_DUPLICATES_STYLE if duplicates else ''}</style></head>"
        "<body>",
        f'<header><h1>Dataset report</h1><p class="path">{text(s["path"], 1000)}</p></header>',
        _verify_section(verify),
        f'<section id="overview"><h2>Overview</h2>{overview}</section>', duplicates or "",
        _classes_section(s), _images_section(s, arrays), _shards_section(s, arrays),
        _rejected_section(s["rejected"]), fields_html, _sheet_section(sheet_png, sheet, sheet_error),
        f'<section id="build"><h2>Build options</h2>{_table(build_rows) if build_rows else "<p>none recorded</p>"}'
        "</section>",
        f'<footer><p class="note">Written by packer {text(__version__)} (<code>packer inspect --html</code>). '
        "The page is self-contained: no scripts, nothing fetched.</p></footer></body></html>\n",
    ])
