"""``inspect``'s view of declared fields (formats/SPEC.md §14): the field table and per-field statistics.

Like the rest of the summary, everything comes from the index: an ``array``, ``classes`` or
``text`` field's values are index columns, and an ``image`` field's formats and sizes are its
``f_<name>__*`` columns, so no shard byte is read. The passes are vectorised and walk a
field's values in groups of at most ``CHUNK_BYTES`` of them, so memory stays bounded on a
100M-sample dataset (a float64 copy of a whole boxes blob could be larger than the index).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import format as fmt

__all__ = ["field_table", "field_stats", "format_fields", "CHUNK_BYTES", "TOP_CLASSES", "MAX_COLUMNS",
           "EXAMPLE_CHARS"]

#: Bytes of one field's values reduced per step.
CHUNK_BYTES = 64 << 20
#: Most frequent classes listed per ``classes`` field (the JSON and the text alike).
TOP_CLASSES = 10
#: Columns (last-axis positions) of an array field given their own min/max/mean; wider records
#: (e.g. 1024-d embeddings) get one line over all their values instead.
MAX_COLUMNS = 16
#: Characters of the example caption shown for a ``text`` field.
EXAMPLE_CHARS = 120
_PERCENTILES = (("min", 0), ("p5", 5), ("median", 50), ("p95", 95), ("max", 100))


def field_table(specs: Any) -> list[dict[str, Any]]:
    """One row per declared field: ``name``, ``kind``, ``type`` (``float32[N,4]``, ``classes(80)``,
    ``text``, ``image``), ``dtype``, ``shape`` (``-1`` for N), ``variable``, ``source``, and
    ``num_classes`` / ``shards`` where they apply."""
    rows = []
    for spec in specs:
        row: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "type": spec.describe().split(": ", 1)[1],
                               "dtype": spec.dtype or None, "shape": list(spec.shape) if spec.kind == "array" else None,
                               "variable": spec.variable, "source": spec.source or spec.name}
        if spec.kind == "classes":
            row["num_classes"] = spec.num_classes
        if spec.kind == "image":
            row["shards"] = len(spec.shards)
        rows.append(row)
    return rows


def field_stats(index: Any) -> list[dict[str, Any]]:
    """Statistics of every declared field of an open ``DatasetIndex``, in declaration order.

    Each entry is a ``field_table`` row plus, by kind:

    * ``array``: ``index_bytes``; ``values`` (count, and per last-axis ``columns`` their
      ``min``/``max``/``mean``, NaN and infinities left out and counted as ``non_finite``); for
      variable arrays also ``rows`` (percentiles of rows per sample, ``total``, ``empty``).
    * ``classes``: ``index_bytes``; ``labels_per_sample`` (percentiles), ``empty``,
      ``classes_used``, ``top`` (id, name, count; most frequent first, ties by id).
    * ``text``: ``index_bytes``; ``length_bytes`` (percentiles of UTF-8 bytes per sample),
      ``empty``, ``example`` (the first non-empty value: sample, key, text cut to
      ``EXAMPLE_CHARS``).
    * ``image``: ``shard_bytes``, ``payload_bytes`` (percentiles), ``width``, ``height``,
      ``formats`` and ``channels`` (counts).
    """
    count = len(index)
    columns = index.index.field_columns
    out = []
    for spec, row in zip(index.fields, field_table(index.fields)):
        if spec.kind == "image":
            row.update(_image_stats(spec, columns, count))
        else:
            values = columns[spec.column]
            offsets = columns[spec.offsets_column] if spec.variable else None
            row["index_bytes"] = int(values.nbytes + (offsets.nbytes if offsets is not None else 0))
            if spec.kind == "array":
                row.update(_array_stats(spec, values, offsets, count))
            elif spec.kind == "classes":
                row.update(_classes_stats(spec, values, offsets))
            else:
                row.update(_text_stats(index, values, offsets))
        out.append(row)
    return out


def percentile_stats(values: np.ndarray, percentiles: tuple[tuple[str, int], ...] = _PERCENTILES
                     ) -> dict[str, Any] | None:
    """Percentiles and the mean of an integer array; None when empty.

    Percentiles are nearest-rank (actual values, no interpolation): the ``q``-th is the smallest
    value with at least ``q`` % of the values at or below it, so the p95 of two values is the larger.
    """
    if len(values) == 0:
        return None
    points = np.percentile(values, [q for _, q in percentiles], method="inverted_cdf")
    stats: dict[str, Any] = {name: int(v) for (name, _), v in zip(percentiles, points)}
    stats["mean"] = round(float(values.mean(dtype=np.float64)), 3)
    return stats


def _row_counts(offsets: np.ndarray, record_bytes: int) -> np.ndarray:
    return np.diff(offsets.astype(np.int64)) // max(record_bytes, 1)


def _array_stats(spec: Any, values: np.ndarray, offsets: np.ndarray | None, count: int) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    if offsets is not None:
        rows = _row_counts(offsets, spec.record_bytes)
        stats["rows"] = {**(percentile_stats(rows) or {}), "total": int(rows.sum()), "empty": int(np.count_nonzero(rows == 0))}
    width = spec.record_shape[-1] if spec.record_shape else 1
    dtype = spec.numpy_dtype
    flat = values.view(dtype) if len(values) else np.zeros(0, dtype=dtype)
    per_column = width <= MAX_COLUMNS
    groups = width if per_column else 1
    # Running reductions over bounded groups of whole records, in float64 (exact for every
    # integer up to 2^53, enough for a summary).
    low = np.full(groups, np.inf)
    high = np.full(groups, -np.inf)
    total = np.zeros(groups)
    finite = np.zeros(groups, dtype=np.int64)
    non_finite = 0
    step = max(width, (CHUNK_BYTES // max(dtype.itemsize, 1)) // width * width)
    for start in range(0, len(flat), step):
        part = flat[start:start + step].astype(np.float64).reshape(-1, groups)
        ok = np.isfinite(part)
        non_finite += int(part.size - np.count_nonzero(ok))
        low = np.minimum(low, np.where(ok, part, np.inf).min(axis=0))
        high = np.maximum(high, np.where(ok, part, -np.inf).max(axis=0))
        total += np.where(ok, part, 0.0).sum(axis=0)
        finite += ok.sum(axis=0)
    stats["values"] = {"count": int(len(flat)), "non_finite": non_finite, "columns": [
        {"column": c if per_column else None, "count": int(finite[c]),
         "min": _number(low[c], dtype) if finite[c] else None, "max": _number(high[c], dtype) if finite[c] else None,
         "mean": float(total[c] / finite[c]) if finite[c] else None} for c in range(groups)]}
    return stats


def _number(value: float, dtype: np.dtype) -> int | float:
    """A min or max as the field's kind of number (ints stay ints in the JSON)."""
    return int(value) if dtype.kind in "iub" else float(value)


def _classes_stats(spec: Any, values: np.ndarray, offsets: np.ndarray) -> dict[str, Any]:
    per_sample = _row_counts(offsets, 8)
    ids = values.view("<i8") if len(values) else np.zeros(0, dtype=np.int64)
    if spec.num_classes <= (1 << 24):  # one counter per class: at most 128 MiB
        counts = np.zeros(spec.num_classes, dtype=np.int64)
        step = CHUNK_BYTES // 8
        for start in range(0, len(ids), step):
            counts += np.bincount(ids[start:start + step], minlength=spec.num_classes)
        used = np.flatnonzero(counts)
        used_counts = counts[used]
    else:  # ids up to 2^40: count the distinct ones only
        used, used_counts = np.unique(ids, return_counts=True)
    top = np.lexsort((used, -used_counts))[:TOP_CLASSES]
    names = spec.classes
    return {"labels_per_sample": percentile_stats(per_sample), "empty": int(np.count_nonzero(per_sample == 0)),
            "labels": int(len(ids)), "classes_used": int(len(used)),
            "top": [{"id": int(used[k]), "name": names[int(used[k])] if names else None, "count": int(used_counts[k])}
                    for k in top.tolist()]}


def _text_stats(index: Any, blob: np.ndarray, offsets: np.ndarray) -> dict[str, Any]:
    lengths = _row_counts(offsets, 1)
    example = None
    nonempty = np.flatnonzero(lengths)
    if len(nonempty):
        sample = int(nonempty[0])
        start = int(offsets[sample])
        raw = blob[start:start + min(int(lengths[sample]), 4 * EXAMPLE_CHARS)].tobytes()
        # replace, never raise: a value that is not UTF-8 is verify's to report, not inspect's
        text = raw.decode("utf-8", "replace")
        example = {"sample": sample, "key": index.key(sample), "text": text[:EXAMPLE_CHARS],
                   "truncated": len(text) > EXAMPLE_CHARS or len(raw) < int(lengths[sample])}
    return {"length_bytes": percentile_stats(lengths), "empty": int(np.count_nonzero(lengths == 0)),
            "example": example}


def _image_stats(spec: Any, columns: Any, count: int) -> dict[str, Any]:
    def part(name: str) -> np.ndarray:
        return columns[spec.image_column(name)]

    width, height = part("width"), part("height")
    known = (width > 0) & (height > 0)
    formats = np.bincount(part("format"), minlength=256) if count else np.zeros(256, dtype=np.int64)
    channels = np.bincount(part("channels"), minlength=256) if count else np.zeros(256, dtype=np.int64)
    return {"shard_bytes": int(sum(entry.size for entry in spec.shards)),
            "payload_bytes": {**(percentile_stats(part("size")) or {}), "total": int(part("size").sum(dtype=np.uint64))},
            "width": percentile_stats(width[known]), "height": percentile_stats(height[known]),
            "unknown_size": int(count - np.count_nonzero(known)),
            "formats": {fmt.ImageFormat.NAMES.get(value, f"format-{value}"): int(n)
                        for value, n in enumerate(formats.tolist()) if n},
            "channels": {str(value): int(n) for value, n in enumerate(channels.tolist()) if n}}


# --- the human view ---------------------------------------------------------------------------

def _spread(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "n/a"
    return f"min {stats['min']}, median {stats['median']}, max {stats['max']}"


def _value(value: Any) -> str:
    return "n/a" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))


def format_fields(fields: list[dict[str, Any]], one_line: Any = str) -> list[str]:
    """The ``field_stats`` entries as text lines: the table, then one block per field.

    Args:
        fields: ``field_stats``' result.
        one_line: makes a stored string safe for one line (class names and captions are data).
    """
    if not fields:
        return []
    name_width = max(len(f["name"]) for f in fields)
    type_width = max(len(f["type"]) for f in fields)
    lines = [f"fields     {len(fields)} declared"]
    for f in fields:
        extra = f", {f['shards']} shard(s)" if f["kind"] == "image" else ""
        lines.append(f"  {f['name']:<{name_width}}  {f['kind']:<7}  {f['type']:<{type_width}}  "
                     f"from {one_line(f['source'])}{extra}")
    for f in fields:
        head = f"  {f['name']:<{name_width}}  "
        pad = " " * len(head)
        body: list[str] = []
        if f["kind"] == "array":
            if "rows" in f:
                rows = f["rows"]
                body.append(f"rows per sample {_spread(rows)} ({rows['total']:,} in all, {rows['empty']:,} "
                            f"sample(s) empty)")
            values = f["values"]
            for column in values["columns"][:MAX_COLUMNS]:
                label = f"column {column['column']}" if column["column"] is not None else "all values"
                body.append(f"{label}: min {_value(column['min'])}, max {_value(column['max'])}, "
                            f"mean {_value(column['mean'])}")
            if values["non_finite"]:
                body.append(f"{values['non_finite']:,} NaN or infinite value(s), left out above")
        elif f["kind"] == "classes":
            body.append(f"{f['num_classes']:,} classes, {f['classes_used']:,} used; labels per sample "
                        f"{_spread(f['labels_per_sample'])} ({f['empty']:,} sample(s) with none)")
            if f["top"]:
                body.append("top " + ", ".join(
                    f"{one_line(t['name']) if t['name'] is not None else t['id']} {t['count']:,}" for t in f["top"]))
        elif f["kind"] == "text":
            body.append(f"length (UTF-8 bytes) {_spread(f['length_bytes'])} ({f['empty']:,} empty)")
            if f["example"]:
                e = f["example"]
                body.append(f"e.g. sample {e['sample']}: {one_line(e['text'])!r}" + (" ..." if e["truncated"] else ""))
        else:
            body.append(f"width {_spread(f['width'])}; height {_spread(f['height'])}")
            body.append("formats " + (", ".join(f"{k} {v:,}" for k, v in f["formats"].items()) or "none")
                        + "; channels " + (", ".join(f"{k}: {v:,}" for k, v in f["channels"].items()) or "none"))
        lines.append(head + body[0])
        lines.extend(pad + line for line in body[1:])
    return lines
