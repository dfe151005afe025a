"""``inspect --duplicates --html``: the report's duplicates section, each pair side by side.

The section lists the counts (per kind, per pair of datasets, leaks), then the groups, leaks
first; each joining pair of a group (every member against the first, for an exact group) is shown
as two thumbnails side by side with where each sample is, its key and class, and the distance.
Thumbnails are PNG ``data:`` URIs decoded here (``pair_thumbnails``), so the page stays
self-contained; every stored string goes through ``svg.text``.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from .svg import text

__all__ = ["PAIRS_SHOWN", "THUMBNAIL", "STYLE", "pair_thumbnails", "duplicates_section"]

#: Pairs drawn in the page (the JSON lists every group).
PAIRS_SHOWN = 60
#: Longer side of each thumbnail, in pixels.
THUMBNAIL = 160


def _shown_pairs(report: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """``(group, member a, member b, pair)`` for the pairs the page draws, leaks first (the report's order)."""
    out = []
    for group in report["groups"]:
        members = group["members"]
        pairs = group["pairs"] or [{"a": 0, "b": k, "distance": 0, "mirrored": False} for k in range(1, len(members))]
        for pair in pairs:
            out.append((group, members[pair["a"]], members[pair["b"]], pair))
            if len(out) >= PAIRS_SHOWN:
                return out
    return out


def pair_thumbnails(report: dict[str, Any], *, remote: Any = None) -> dict[tuple[str, int], bytes | None]:
    """PNG thumbnails of every sample the page shows: ``(dataset name, sample) -> PNG`` (None when
    the sample does not decode: the page says so)."""
    from PIL import Image, ImageOps

    from ..codecs import dataset_max_pixels
    from ..dataset import open_dataset
    from ..decode import decode_image
    from ..errors import PackerError
    from ..format import checksum

    wanted: dict[str, set[int]] = {}
    for _, a, b, _ in _shown_pairs(report):
        for member in (a, b):
            wanted.setdefault(member["dataset"], set()).add(member["sample"])
    locations = {entry["name"]: entry["location"] for entry in report["datasets"]}
    thumbs: dict[tuple[str, int], bytes | None] = {}
    for name, samples in wanted.items():
        with open_dataset(locations[name], remote=remote) as ds:
            limit = dataset_max_pixels(ds.manifest)
            for number in sorted(samples):
                try:
                    data = ds.get(number)
                    if checksum(data) != int(ds.index.checksum[number]):
                        raise PackerError("checksum mismatch")
                    pixels = decode_image(data, int(ds.index.image_format[number]), name=ds.key(number),
                                          max_pixels=limit)
                    image = ImageOps.contain(Image.fromarray(pixels), (THUMBNAIL, THUMBNAIL),
                                             Image.Resampling.BILINEAR)
                    png = io.BytesIO()
                    image.save(png, format="PNG")
                    thumbs[(name, number)] = png.getvalue()
                except PackerError:
                    thumbs[(name, number)] = None
    return thumbs


def _figure(member: dict[str, Any], png: bytes | None) -> str:
    caption = (f"{text(member['dataset'])}[{member['sample']}] <code>{text(member['key'] or '')}</code> "
               f"({text(member['class'])})")
    if png is None:
        image = '<div class="nothumb">not decodable</div>'
    else:
        data = base64.b64encode(png).decode("ascii")
        image = f'<img alt="sample {member["sample"]} of {text(member["dataset"])}" src="data:image/png;base64,{data}">'
    return f"<figure>{image}<figcaption>{caption}</figcaption></figure>"


def duplicates_section(report: dict[str, Any], thumbs: dict[tuple[str, int], bytes | None]) -> str:
    """The ``<section id="duplicates">`` of the report page for ``DuplicateReport.to_json()``."""
    counts = report["counts"]
    rows = "".join(f"<tr><td>{text(kind)}</td><td class=\"num\">{counts[kind]['groups']:,}</td>"
                   f"<td class=\"num\">{counts[kind]['pairs']:,}</td><td class=\"num\">{counts[kind]['samples']:,}</td></tr>"
                   for kind in ("exact", "near"))
    parts = ['<section id="duplicates"><h2>Duplicates and leaks</h2>',
             f'<p class="note">Exact: byte-identical. Near: perceptual hashes ({text(report["algorithm"])}) within '
             f'{report["threshold"]} of {report["hash_bits"]} bits'
             f'{"; mirror images count" if report["flips"] else ""}.</p>',
             "<table><tr><th>kind</th><th>groups</th><th>pairs</th><th>samples</th></tr>", rows, "</table>"]
    if len(report["datasets"]) > 1:
        leaked = ", ".join(f"{text(name)}: {n:,}" for name, n in counts["leaks"]["samples"].items())
        status = "bad" if counts["leaks"]["groups"] else "ok"
        parts.append(f'<div class="status {status}">{counts["leaks"]["groups"]:,} group(s) cross datasets. '
                     f"Samples with a copy in another dataset: {leaked}.</div>")
    if counts["by_split_pair"]:
        parts.append("<table><tr><th>datasets</th><th>exact pairs</th><th>near pairs</th></tr>")
        parts.extend(f"<tr><td>{text(s['a'])} ~ {text(s['b'])}</td><td class=\"num\">{s['exact_pairs']:,}</td>"
                     f"<td class=\"num\">{s['near_pairs']:,}</td></tr>" for s in counts["by_split_pair"])
        parts.append("</table>")
    shown = _shown_pairs(report)
    if not shown:
        parts.append("<p>No duplicates found.</p></section>")
        return "".join(parts)
    parts.append('<div class="pairs">')
    for group, a, b, pair in shown:
        label = ("leak, " if group["leak"] else "") + group["kind"]
        distance = (f"{pair['distance']} bit(s){', mirrored' if pair['mirrored'] else ''}" if group["kind"] == "near"
                    else "identical bytes")
        parts.append(f'<div class="pair"><p class="note">{text(label)}: {text(distance)}</p>'
                     f"{_figure(a, thumbs.get((a['dataset'], a['sample'])))}"
                     f"{_figure(b, thumbs.get((b['dataset'], b['sample'])))}</div>")
    parts.append("</div>")
    total = sum(max(len(g["pairs"]), len(g["members"]) - 1) for g in report["groups"])
    if total > len(shown) or report["groups_total"] > report["groups_shown"]:
        parts.append(f'<p class="note">{len(shown):,} pair(s) drawn; <code>packer inspect DATASET --duplicates '
                     "--json</code> lists every group.</p>")
    parts.append("</section>")
    return "".join(parts)


#: Styles the section adds to the page's one ``<style>`` element.
STYLE = """
.pairs { display: flex; flex-wrap: wrap; gap: 1em; } .pair { border: 1px solid #ddd; padding: 0.4em; }
.pair figure { display: inline-block; margin: 0.2em; width: 170px; vertical-align: top; }
.pair figcaption { font-size: 0.8em; word-break: break-all; } .nothumb { width: 160px; height: 60px;
  background: #eee; text-align: center; line-height: 60px; }
"""
