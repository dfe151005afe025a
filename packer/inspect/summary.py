"""``inspect``'s dataset summary: counts, bytes, classes and image statistics from the index alone.

``summarize`` opens the manifest and index (``open_index``: validated, never a shard byte) and
reduces the index columns with vectorised numpy, so a million-sample dataset summarises in
tens of milliseconds. ``format_summary`` renders the same dictionary for people.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import numpy as np

from .. import format as fmt
from .fields import field_stats, format_fields, percentile_stats

__all__ = ["summarize", "format_summary", "build_settings_rows", "REJECTED_SHOWN"]

#: Rejected build-report entries included in full (all are counted by reason).
REJECTED_SHOWN = 20
#: Classes listed one per line by ``format_summary`` (the JSON holds all of them).
_CLASSES_SHOWN = 30
_PERCENTILES = (("min", 0), ("p1", 1), ("p5", 5), ("p25", 25), ("median", 50), ("p75", 75), ("p95", 95),
                ("p99", 99), ("max", 100))


def summarize(path: str | os.PathLike[str], *, rejected_shown: int = REJECTED_SHOWN) -> dict[str, Any]:
    """Describe a dataset without reading its shards.

    Args:
        path: the dataset folder or URL (``open_index``); the summary names it as given.
        rejected_shown: how many rejected files of the build report to include in full.

    Returns:
        A JSON-ready dict: ``samples``, ``shards`` (count and size statistics), ``classes`` (name,
        label, count) and ``unlabeled``, ``bytes`` (total, shards, index, manifest, payload,
        header, padding, ``padding_overhead_percent``), ``sample_bytes`` (size statistics),
        ``alignment``, ``codec``, ``build``, ``history``, ``created_by``, ``images`` (width and
        height percentiles over known sizes, counts by format and by channel count), ``fields``
        (the declared fields' table and statistics, ``packer.inspect.fields.field_stats``; ``[]``
        without fields; ``bytes.field_shards`` is their image shards' size) and ``rejected``
        (from ``build-report.jsonl``, wherever the dataset is: count by reason and the first entries).

    Raises:
        PackerError: the manifest or index is missing or damaged.
    """
    from ..dataset import open_index

    with open_index(path) as index:
        manifest = index.manifest
        ix = index.index
        count = len(index)
        sizes = ix.size
        shard_sizes = np.array([s.size for s in manifest.shards], dtype=np.int64)
        shard_counts = np.array([s.sample_count for s in manifest.shards], dtype=np.int64)
        # the bytes on disk are the dataset's, a view's too (its own payload is in "view")
        stored = ix.base.size if index.view is not None else sizes
        payload = int(stored.sum(dtype=np.uint64)) if len(stored) else 0
        shard_bytes = int(shard_sizes.sum())
        header_bytes = len(manifest.shards) * fmt.shard_data_offset(manifest.alignment)
        padding_bytes = shard_bytes - payload - header_bytes
        # image fields' parallel shards (§14.3) are on disk too: part of the total, counted apart
        field_shard_bytes = sum(entry.size for spec in manifest.fields for entry in spec.shards)
        manifest_bytes = len(index.place.manifest_bytes)
        labels = ix.label
        classes = manifest.classes
        # Only labels that name a class are counted here, so memory is O(classes + samples)
        # whatever the values (a manifest label may be any i64, e.g. 10^12).
        in_range = labels[(labels >= 0) & (labels < len(classes))] if count else labels[:0]
        class_counts = np.bincount(in_range, minlength=len(classes))
        summary: dict[str, Any] = {
            "path": index.location,
            "created_by": manifest.created_by,
            "dataset_format_version": manifest.format_version,
            "samples": count,
            "shards": {"count": len(manifest.shards), "bytes": _stats(shard_sizes),
                       "samples": _stats(shard_counts)},
            "classes": [{"label": label, "name": name, "count": int(class_counts[label])}
                        for label, name in enumerate(classes)],
            "classes_checksum": fmt.class_list_checksum(classes) if classes else None,
            "labels": _label_counts(labels) if not classes else None,
            "unlabeled": int(np.count_nonzero(labels < 0)),
            "bytes": {
                "total": shard_bytes + field_shard_bytes + manifest.index.size + manifest_bytes,
                "shards": shard_bytes,
                "field_shards": field_shard_bytes,
                "index": manifest.index.size,
                "manifest": manifest_bytes,
                "payload": payload,
                "header": header_bytes,
                "padding": padding_bytes,
                "padding_overhead_percent": round(100.0 * (shard_bytes - payload) / payload, 3) if payload else 0.0,
            },
            "sample_bytes": _stats(sizes),
            "alignment": manifest.alignment,
            "codec": manifest.codec,
            "build": manifest.build,
            "history": list(manifest.history),
            "images": _image_stats(ix),
            "fields": field_stats(index),
            "rejected": _rejected(index.build_report(must_contain=b'"rejected"'), rejected_shown),
            # a view (SPEC §17): the samples above are its own; shards and bytes are its dataset's
            "view": None if index.view is None else {
                "base": index.view.base, "base_samples": index.view.base_samples, "samples": count,
                "base_samples_now": index.manifest.sample_count, "selectors": list(index.view.selectors),
                "checksum": fmt.checksum_hex(index.view.checksum),
                "payload": int(sizes.sum(dtype=np.uint64)) if count else 0},
        }
        del ix, labels, sizes
    return summary


def _stats(values: np.ndarray) -> dict[str, Any] | None:
    """Percentiles (actual values) and the mean of an integer array, at the summary's points."""
    return percentile_stats(values, _PERCENTILES)


def _label_counts(labels: np.ndarray) -> dict[str, int] | None:
    """Counts by integer label for datasets without class names (manifest-labelled builds)."""
    known = labels[labels >= 0]
    if len(known) == 0:
        return None
    values, counts = np.unique(known, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts)}


def _image_stats(ix: fmt.IndexColumns) -> dict[str, Any]:
    width, height = ix.width, ix.height
    known = (width > 0) & (height > 0)
    formats = np.bincount(ix.image_format, minlength=256) if len(width) else np.zeros(256, dtype=np.int64)
    channels = np.bincount(ix.channels, minlength=256) if len(width) else np.zeros(256, dtype=np.int64)
    return {
        "width": _stats(width[known]),
        "height": _stats(height[known]),
        "unknown_size": int(len(width) - np.count_nonzero(known)),
        "formats": {fmt.ImageFormat.NAMES.get(value, f"format-{value}"): int(n)
                    for value, n in enumerate(formats.tolist()) if n},
        "channels": {str(value): int(n) for value, n in enumerate(channels.tolist()) if n},
    }


def _rejected(report: Iterator[dict[str, Any]] | None, shown: int) -> dict[str, Any]:
    """Rejected files from the (informative) build report: counts by reason, the first ``shown``."""
    by_reason: dict[str, int] = {}
    first: list[dict[str, Any]] = []
    count = 0
    if report is None:
        return {"available": False, "count": None, "by_reason": {}, "first": []}
    # Bounded, regular-file-only, inside the dataset folder (or its copy in the node cache); bad
    # lines ignored (files.iter_json_lines).
    for entry in report:
        if entry.get("type") != "rejected":
            continue
        count += 1
        reason = _text(entry.get("reason", "unknown"))
        by_reason[reason] = by_reason.get(reason, 0) + 1
        if len(first) < shown:
            first.append({k: _text(entry.get(k)) for k in ("key", "reason", "message")})
    return {"available": True, "count": count, "by_reason": dict(sorted(by_reason.items())), "first": first}


def _one_line(text: str) -> str:
    """A name or message on one line: its line breaks shown as ``\\n`` (the CLI escapes the rest)."""
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\u2028", "\\u2028").replace(
        "\u2029", "\\u2029")


def _text(value: Any) -> str:
    """An informational report field as a string (anything else is shown by its JSON text)."""
    if isinstance(value, str):
        return value
    return json.dumps(fmt.json_ready(value), sort_keys=True)[:1000]


# --- the human view ---------------------------------------------------------------------------

def _size(n: int | float) -> str:
    """Bytes as a short human string (decimal units, like ``ls -h --si``)."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} PB"  # pragma: no cover


def _spread(stats: dict[str, Any] | None, unit: str = "") -> str:
    if not stats:
        return "n/a"
    show = _size if unit == "bytes" else str
    return (f"min {show(stats['min'])}, median {show(stats['median'])}, max {show(stats['max'])} "
            f"(p5 {show(stats['p5'])}, p95 {show(stats['p95'])})")


def format_summary(summary: dict[str, Any]) -> str:
    """Render a ``summarize`` result as readable text (one fact per line)."""
    s = summary
    b = s["bytes"]
    view = s.get("view")
    lines = [
        f"dataset    {s['path']}  (format v{s['dataset_format_version']}, written by {s['created_by'] or 'unknown'})",
        *([f"view       {view['samples']:,} of the {view['base_samples']:,} samples of {_one_line(view['base'])} "
           f"(payload {_size(view['payload'])}; selectors: "
           f"{_one_line(json.dumps(view['selectors'], sort_keys=True, ensure_ascii=False))}); shards and bytes below "
           f"are the dataset's"] if view else []),
        f"samples    {s['samples']:,} in {s['shards']['count']:,} shard(s)"
        + (f"; shard size {_spread(s['shards']['bytes'], 'bytes')}" if s["shards"]["bytes"] else ""),
        f"bytes      {_size(b['total'])} on disk: payload {_size(b['payload'])}, padding {_size(b['padding'])}, "
        f"shard headers {_size(b['header'])}, index {_size(b['index'])}"
        + (f", image fields' shards {_size(b['field_shards'])}" if b.get("field_shards") else ""),
        f"overhead   {b['padding_overhead_percent']:.2f} % of the payload (alignment padding and headers)",
        f"alignment  {s['alignment']}",
        "codec      " + " ".join([s["codec"].get("name", "?")] + [f"{k}={v}" for k, v in sorted(s["codec"].items())
                                                               if k != "name"]),
        f"sample     {_spread(s['sample_bytes'], 'bytes')}",
    ]
    settings = fmt.recorded_build_settings(s["build"])  # nested, or the flat options of older builds
    if settings is not None:
        shown = {k: (f"<{len(v)} names>" if k.endswith("classes") and isinstance(v, list) else v)
                 for k, v in build_settings_rows(settings)}
        lines.append("build      " + " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(shown.items())))
    notes = s["build"].get("codec_notes") if isinstance(s["build"], dict) else None
    if isinstance(notes, dict) and notes:  # what the codec did, e.g. JPEGs tiled or kept as they are
        lines.append("codec did " + ", ".join(f"{n:,} {k}" for k, n in notes.items()
                                              if isinstance(n, int)))
    if s["history"]:
        lines.append(f"history    {len(s['history'])} generation(s)")
    classes = s["classes"]
    if classes:
        unlabeled = f" (+ {s['unlabeled']:,} unlabeled samples)" if s["unlabeled"] else ""
        lines.append(f"classes    {len(classes):,}{unlabeled} (class-list checksum {s.get('classes_checksum')})")
        width = max(len(c["name"]) for c in classes[:_CLASSES_SHOWN])
        for c in classes[:_CLASSES_SHOWN]:
            lines.append(f"  {_one_line(c['name']):<{width}}  {c['count']:>10,}")
        if len(classes) > _CLASSES_SHOWN:
            rest = sum(c["count"] for c in classes[_CLASSES_SHOWN:])
            lines.append(f"  ... {len(classes) - _CLASSES_SHOWN:,} more classes ({rest:,} samples); --json lists all")
    elif s["labels"]:
        lines.append(f"labels     {len(s['labels']):,} distinct integer labels (no class names)")
    else:
        lines.append("classes    none (unlabeled)")
    images = s["images"]
    lines.append(f"width      {_spread(images['width'])}")
    lines.append(f"height     {_spread(images['height'])}")
    lines.append("formats    " + (", ".join(f"{k} {v:,}" for k, v in images["formats"].items()) or "none"))
    lines.append("channels   " + (", ".join(f"{k}: {v:,}" for k, v in images["channels"].items()) or "none")
                 + (f"; size unknown for {images['unknown_size']:,}" if images["unknown_size"] else ""))
    lines.extend(format_fields(s.get("fields") or [], one_line=_one_line))
    rejected = s["rejected"]
    if not rejected["available"]:
        lines.append("rejected   unknown (no build-report.jsonl)")
    else:
        reasons = ", ".join(f"{n:,} {r}" for r, n in rejected["by_reason"].items())
        lines.append(f"rejected   {rejected['count']:,} file(s) at build time" + (f": {reasons}" if reasons else ""))
        for entry in rejected["first"]:
            lines.append(f"  {_one_line(entry['key'])}: {_one_line(entry['reason'])} ({_one_line(entry['message'])})")
        if rejected["count"] > len(rejected["first"]):
            lines.append(f"  ... {rejected['count'] - len(rejected['first']):,} more in build-report.jsonl")
    return "\n".join(lines)


def build_settings_rows(settings: dict[str, Any]) -> list[tuple[str, Any]]:
    """The recorded build settings (``format.recorded_build_settings``) as ``(group.name, value)``
    rows for display, unset values left out (``layout.seed``, ``codec``, ``labels.classes``)."""
    rows = []
    for group, members in sorted(settings.items()):
        if isinstance(members, dict):
            rows += [(f"{group}.{name}", value) for name, value in sorted(members.items()) if value not in (None, [])]
        elif members is not None:
            rows.append((group, members))
    return rows
