"""The manifest door: CSV/TSV with a ``path,label[,...]`` header, or JSONL objects with ``path``,
``label`` and optional ``metadata``, listed in the manifest's order, paths relative to a root.

Labels are listed as written (a JSON integer, or text); the source contract reads them by
``--label-type`` (``labels.LABEL_TYPES`` states the ``auto`` rule). With declared fields, a
row's field values are its columns (members); see ``list_manifest``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from ..errors import SourceError
from ..fields import FieldSpec, FieldValueError
from .._internal.files import open_user_file
from .fieldvalues import FIELD_REJECTION, FieldRowBuilder
from .labels import INT64
from .listing import DoorOptions, RawListing, RawListingBuilder
from .strictjson import MAX_JSON_DEPTH, json_depth_ok, parse_strict_json

#: JSONL limits: a row longer than this, or nested deeper, is rejected before it is parsed
#: (a row nested 100,000 brackets deep would otherwise end the build with RecursionError).
MAX_MANIFEST_ROW_BYTES = 1 << 20
#: Header names people give the path and label columns, and what to rename them to.
_PATH_ALIASES = ("file_name", "filename", "file", "filepath", "file_path", "image", "image_path", "img", "path ")
_LABEL_ALIASES = ("labels", "class", "class_name", "target", "category", "y", "label_id")


def header_hints(columns: list[str]) -> list[str]:
    """Suggested fixes for a manifest header (CSV columns or JSONL keys) without path/label."""
    hints = []
    stripped = {c.strip().lower(): c for c in columns if isinstance(c, str)}
    for wanted, aliases in (("path", _PATH_ALIASES), ("label", _LABEL_ALIASES)):
        if wanted in columns:
            continue
        if wanted in stripped:
            hints.append(f"column {stripped[wanted]!r} has spaces or capitals: name it exactly {wanted!r}")
            continue
        alias = next((stripped[a] for a in aliases if a in stripped), None)
        if alias is not None:
            origin = " (HuggingFace imagefolder metadata names it file_name)" if alias.strip() == "file_name" else ""
            hints.append(f"rename column {alias!r} to {wanted!r}{origin}")
        else:
            hints.append(f"no {wanted!r} column (columns: {', '.join(map(repr, columns[:10]))})")
    return hints


def _manifest_rows(path: Path, *, label_optional: bool = False
                   ) -> Iterator[tuple[int, dict[str, object] | None, str]]:
    """Yield (line number, row, error) from a CSV or JSONL manifest, streaming line by line.

    Raises:
        SourceError: not a manifest suffix, unreadable, not UTF-8, or a CSV header without a
            ``path`` and ``label`` column or with a repeated column (the fix is suggested).
    """
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".ndjson", ".csv", ".tsv"):
        raise SourceError("manifest must be .csv, .tsv or .jsonl", path=path)
    raw, _ = open_user_file(path, what="the manifest", error=SourceError)  # a FIFO or device is refused
    handle = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
    try:
        with handle:
            if suffix in (".jsonl", ".ndjson"):
                yield from _jsonl_rows(handle)
            else:
                yield from _csv_rows(_bounded_lines(handle, path), path, "\t" if suffix == ".tsv" else ",",
                                     label_optional=label_optional)
    except UnicodeDecodeError as exc:
        raise SourceError(f"manifest is not UTF-8 text ({exc.reason})", path=path) from None
    except csv.Error as exc:
        raise SourceError(f"manifest is not valid CSV: {exc}", path=path) from None
    except OSError as exc:
        raise SourceError(f"cannot read the manifest: {exc.strerror or exc}", path=path) from None


def _bounded_lines(handle: Any, path: Path) -> Iterator[str]:
    """A CSV manifest's lines, each read with a cap: a 10 GB line without a newline is refused,
    never held in memory whole (csv would read it all before its own field limit applies)."""
    while True:
        line = handle.readline(MAX_MANIFEST_ROW_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_MANIFEST_ROW_BYTES and not line.endswith("\n"):
            raise SourceError(f"manifest line is longer than {MAX_MANIFEST_ROW_BYTES} characters (is it a CSV "
                              f"manifest?)", path=path)
        yield line


def _jsonl_rows(handle: Any) -> Iterator[tuple[int, dict[str, object] | None, str]]:
    number = 0
    while True:
        # readline with a cap: a 10 GB line without a newline is read in bounded pieces
        line = handle.readline(MAX_MANIFEST_ROW_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_MANIFEST_ROW_BYTES and not line.endswith("\n"):
            while line and not line.endswith("\n"):  # skip the rest of the oversize row
                line = handle.readline(MAX_MANIFEST_ROW_BYTES + 1)
            yield number, None, f"line is longer than {MAX_MANIFEST_ROW_BYTES} characters"
            continue
        if not line.strip():
            continue
        if not json_depth_ok(line):
            yield number, None, f"line nests brackets deeper than {MAX_JSON_DEPTH} levels"
            continue
        try:
            row = parse_strict_json(line)
        except (ValueError, RecursionError) as exc:
            yield number, None, f"line is not strict JSON: {exc}"
            continue
        yield (number, row, "") if isinstance(row, dict) else (number, None, "line is not a JSON object")


def _csv_rows(handle: Any, path: Path, delimiter: str, *, label_optional: bool = False
              ) -> Iterator[tuple[int, dict[str, object] | None, str]]:
    reader = csv.reader(handle, delimiter=delimiter)
    header = next(reader, None)
    if not header:
        raise SourceError("CSV manifest is empty (it needs a header row: path,label)", path=path)
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:  # csv.DictReader would silently keep the last of two 'path' columns
        raise SourceError(f"CSV manifest header repeats column(s) {repeated}: each column must appear once",
                          path=path)
    if "path" not in header or ("label" not in header and not label_optional):
        raise SourceError(f"CSV manifest needs a header row with 'path' and 'label' columns, got {header[:10]}: "
                          + "; ".join(header_hints(header)), path=path)
    if "metadata" in header:
        raise SourceError("a CSV column named 'metadata' would be stored as a string, not an object: rename "
                          "it (every column other than path and label is stored as a metadata field), or "
                          "use a JSONL manifest with a 'metadata' object", path=path)
    width = len(header)
    for values in reader:
        if not values:
            continue
        if len(values) != width:
            yield reader.line_num, None, f"row has {len(values)} fields, the header has {width}"
            continue
        yield reader.line_num, dict(zip(header, values)), ""


def _row_metadata(row: dict[str, object], jsonl: bool, exclude: frozenset[str] = frozenset()
                  ) -> tuple[bytes | None, str]:
    """(canonical JSON metadata or b"", error); bytes None when the row's metadata is refused.

    ``exclude``: columns that are declared fields' sources (stored as fields, not metadata).
    """
    if jsonl and "metadata" in row:
        meta_obj = row["metadata"]
        if meta_obj is None:
            return b"", ""
        if not isinstance(meta_obj, dict):
            return None, f"metadata must be a JSON object, got {type(meta_obj).__name__}"
    else:  # CSV columns, or a JSONL row's other keys, are the metadata fields
        meta_obj = {k: v for k, v in row.items() if k not in ("path", "label") and k not in exclude}
    if not meta_obj:
        return b"", ""
    try:
        text = json.dumps(meta_obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError) as exc:  # non-finite numbers cannot reach here (parse_strict_json)
        return None, f"metadata is not storable as strict JSON ({exc})"
    return text.encode("utf-8", "surrogatepass"), ""


def check_row_file(rel: str, root: Path) -> tuple[str, int, str, str]:
    """(key, size, rejection reason, message) of a manifest path; reason "" when usable."""
    if "\x00" in rel:  # no usable key: the caller names the row by its line instead
        return "", 0, "bad-manifest-row", "path contains a NUL character"
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no file name and no valid key
        return "", 0, "undecodable-name", "path is not valid Unicode text"
    key = rel.replace(os.sep, "/")
    normal = os.path.normpath(rel)
    # Lexical check only (like the folder walk, symlinks are followed): resolving every path
    # with realpath would cost one lstat per path component per row.
    if os.path.isabs(rel) or normal == ".." or normal.startswith(".." + os.sep):
        return key, 0, "outside-root", f"path leads outside the root {root}"
    key = normal.replace(os.sep, "/")  # one spelling per file: "a/./b.jpg" is "a/b.jpg"
    full = os.path.join(root, normal)
    try:
        st = os.stat(full)
    except FileNotFoundError:
        return key, 0, "dangling-symlink" if os.path.islink(full) else "missing", "file does not exist"
    except OSError as exc:
        return key, 0, "unreadable", f"cannot stat: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return key, 0, "not-a-file", "not a regular file"
    return key, st.st_size, "", ""


def _row_value(row: dict[str, object], spec: FieldSpec) -> object:
    if spec.source not in row:
        raise FieldValueError(f"field {spec.name!r}: the row has no {spec.source!r} "
                              f"{'member' if not isinstance(row.get('path'), str) else 'column or member'}")
    return row[spec.source]


def _row_image(spec: FieldSpec, value: object, root: Path) -> tuple[str, int]:
    """(key, size) of an image field's file named by a manifest row, relative to ``root``."""
    if not isinstance(value, str) or not value:
        raise FieldValueError(f"field {spec.name!r} is an image: its value must be a path relative to the root, "
                              f"got {value!r}")
    key, size, reason, message = check_row_file(value, root)
    if reason:
        raise FieldValueError(f"field {spec.name!r}: {value!r}: {message} ({reason})")
    if size == 0:
        raise FieldValueError(f"field {spec.name!r}: {value!r} is an empty file")
    return key, size


#: The build report's reason for a row whose label cannot be a label at all (a list, a float).
_ROW_REJECTION = "bad-manifest-row"


def _row_label(label: object, out: RawListingBuilder) -> tuple[tuple[int, int] | None, str]:
    """A row's label as written: a JSON integer, or text (a CSV cell, a JSON string) that the
    contract types by ``--label-type``; ``(None, why)`` for what cannot be a label."""
    if isinstance(label, list):
        return None, (f"label {label!r} is a list (multi-label): a sample has one integer label; put the list "
                      f"in metadata")
    if isinstance(label, int) and not isinstance(label, bool):
        if label not in INT64:
            return None, f"label {label} does not fit in a signed 64-bit integer"
        return out.int_label(label), ""
    if isinstance(label, str) and label:
        return out.text_label(label), ""
    return None, f"label must be an integer or a class name, got {label!r}"


def list_manifest(manifest: str | os.PathLike[str], door: DoorOptions = DoorOptions()) -> RawListing:
    """List the images named by a CSV/JSONL manifest, in the manifest's order, labels as written.

    CSV columns other than ``path`` and ``label`` become the sample's metadata (strings); JSONL
    rows may carry a ``metadata`` object (strict JSON: no NaN/Infinity, rows at most
    ``MAX_MANIFEST_ROW_BYTES`` long and ``MAX_JSON_DEPTH`` deep). A JSON integer label is an
    integer; a CSV cell or JSON string is text, typed by the contract (``--label-type``).
    Streaming: rows go straight into flat arrays, so a manifest of 100 M rows is never a list of
    100 M Python objects.

    Args:
        manifest: the ``.csv``/``.tsv``/``.jsonl`` file (a regular file: a FIFO is refused).
        door: ``root``: the folder paths are relative to (default: the manifest's folder);
            ``fields``: declared fields (``packer.fields``): each row's value of field F is its
            column (JSONL member) ``F.source``; a CSV cell of an array or classes field is JSON
            (classes also ``a|b|c``); an image field's value is a path relative to ``root``.
            With fields declared the ``label`` column is optional (missing: no label). A row
            whose value is missing or does not fit is rejected as ``bad-field``.

    Raises:
        SourceError: unreadable manifest, a header without path/label.
    """
    manifest_path = Path(manifest)
    fields = door.fields
    if not manifest_path.is_file():
        raise SourceError("manifest file does not exist", path=manifest_path)
    root_path = Path(door.source.root) if door.source.root is not None else manifest_path.parent
    if not root_path.is_dir():
        raise SourceError("manifest root is not a folder", path=root_path)
    jsonl = manifest_path.suffix.lower() in (".jsonl", ".ndjson")
    out = RawListingBuilder(door.progress)
    first_keys: list[str] | None = None  # the first rejected JSONL row's keys, for the header hints
    field_rows = FieldRowBuilder(fields) if fields else None
    field_sources = frozenset(spec.source for spec in fields)
    for number, row, error in _manifest_rows(manifest_path, label_optional=bool(fields)):
        where = f"{manifest_path.name}:{number}"
        if row is None:
            out.reject(where, _ROW_REJECTION, error)
            continue
        rel = row.get("path")
        if not isinstance(rel, str) or not rel or ("label" not in row and not fields):
            first_keys = first_keys if first_keys is not None else [str(k) for k in row]
            hint = "; ".join(header_hints([str(k) for k in row]))
            out.reject(where, _ROW_REJECTION, f"row needs a non-empty 'path' and a 'label' ({hint})")
            continue
        if "label" in row:
            label, message = _row_label(row["label"], out)
            if label is None:
                out.reject(where, _ROW_REJECTION, message)
                continue
        else:
            label = RawListingBuilder.NONE  # detection, captions: samples need no class
        meta, meta_error = _row_metadata(row, jsonl, field_sources)
        if meta is None:
            out.reject(where, "bad-metadata", meta_error)
            continue
        key, size, reason, message = check_row_file(rel, root_path)
        if reason:
            out.reject(key or where, reason, message)
            continue
        if field_rows is not None:
            try:
                values = field_rows.encode(lambda spec: _row_value(row, spec), from_text=not jsonl,
                                           resolve_image=lambda spec, value: _row_image(spec, value, root_path))
            except FieldValueError as exc:
                out.reject(key, FIELD_REJECTION, str(exc))
                continue
            field_rows.add(values)
        out.add(key.encode("utf-8"), size, label, meta)
    return out.finish(root_path, "manifest", fields=field_rows.finish() if field_rows is not None else None,
                      empty_what="manifest lists no usable files", empty_path=manifest_path,
                      empty_hints=tuple(header_hints(first_keys)) if first_keys else ())
