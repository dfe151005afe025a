"""COCO-style detection annotations as a source: ``instances_train2017.json`` plus its image folder.

``packer build instances_train2017.json OUT --root train2017/`` packs one sample per entry of
``images`` (its ``file_name`` relative to ``--root``; default: the annotation file's folder), in
the file's order, with the declared fields ``COCO_FIELDS``:

* ``boxes`` ``float32[N,4]``: the image's objects as **XYXY in absolute pixels**
  (``x1, y1, x2, y2``), converted from COCO's ``[x, y, width, height]`` (``x2 = x + width``,
  computed in float64), the format torchvision's transforms v2 take by default
  (``BoundingBoxFormat.XYXY``). Boxes are stored as written: not clipped to the image.
* ``labels`` ``int64[N]``: the category of each box as ``0..C-1``, categories numbered in
  ascending ``id`` order; the field's ``classes`` are the category names in that order (SPEC
  §14.1: names of an integer array's values). The declaration also records the COCO ids in its
  ``source``:
  ``coco:category_id as 0..C-1 by ascending id; categories [[1,"person"],[2,"bicycle"],...]``
  (``categories[k]`` is label ``k``'s COCO id and name; ``coco_categories`` reads it back), so
  a label maps back to its id for COCO evaluation. The names are not the dataset's ``classes``:
  those name the main label (R40: every main label in range), and a detection image has none.
* ``iscrowd`` ``uint8[N]`` (0 or 1; absent means 0), ``area`` ``float32[N]`` (COCO's ``area``,
  the segmentation's area; absent means ``width * height``), ``image_id`` ``int64`` (the image's
  COCO ``id``).

A sample's main label is -1 (a detection image has no one class), and the dataset has no ``classes``. Objects keep the order of the
``annotations`` array. An image without annotations is packed with N = 0. Segmentation
(polygons, RLE) and keypoints are not stored: ``area`` and ``iscrowd`` are, so COCO-style
evaluation of boxes works from the dataset alone.

**Checks.** The top level must be an object whose ``images`` and ``categories`` are arrays
(``annotations`` may be absent: an image-info file); otherwise, and for categories that are not
``{"id": int, "name": str}`` with unique ids and names, the source is unusable
(``SourceError``). Per entry, the problem is reported in the build report:

* an ``images`` entry without an integer ``id`` (in int64) or a string ``file_name``:
  ``bad-manifest-row``; a repeated ``id``: ``duplicate-entry`` (its annotations go to the
  first); a path that is missing or leads outside the root: as for manifests;
* an annotation that is not an object, or whose ``image_id`` names no image: dropped, reported
  as ``bad-annotation`` (there is no image to reject);
* an annotation of a known image with an unknown ``category_id``, a ``bbox`` that is not four
  finite numbers with width and height >= 0 (NaN, Infinity, a string, a value past float32),
  an ``area`` that is not a finite number >= 0, or an ``iscrowd`` other than 0/1: its **image**
  is rejected (``bad-annotation``, naming the annotation's ``id``), not the annotation dropped:
  the image's other objects would remain, and the one left out would be trained as background.

**Memory.** The annotation file is loaded whole with the standard ``json`` module (a 1 GB
file takes a few GB of Python objects while listing: acceptable for a one-off listing, and no
streaming parser is needed). The per-object values are then checked into flat arrays, and each
sample's values go into the listing's field table (``build/fieldvalues.py``); the parsed
document is dropped before packing starts.
"""

from __future__ import annotations

import json
import math
import os
import re
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OptionError, SourceError
from ..fields import MAX_VALUE_BYTES, FieldSpec
from .._internal.files import MAX_USER_JSON_DEPTH, json_depth_exceeds, read_user_file
from .fieldvalues import FieldRowBuilder

from .strictjson import lone_surrogate
from .labels import INT64
from .listing import DoorOptions, RawListing, RawListingBuilder
from .manifest import check_row_file

__all__ = ["COCO_FIELDS", "list_coco", "looks_like_coco", "coco_categories", "ANNOTATION_REJECTION"]

#: The build report's reason for a malformed annotation (or the image it makes unusable).
ANNOTATION_REJECTION = "bad-annotation"
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_MANIFEST_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
_COCO_KEY = re.compile(rb'"(images|annotations|categories)"\s*:')


_CATEGORIES = "; categories "


def _fields(categories: list[tuple[int, str]]) -> tuple[FieldSpec, ...]:
    table = json.dumps([[i, name] for i, name in categories], ensure_ascii=False, separators=(",", ":"))
    return (
        FieldSpec("boxes", "array", "float32", (-1, 4), source="coco:bbox as XYXY absolute pixels (x1,y1,x2,y2), "
                                                               "from COCO's XYWH"),
        FieldSpec("labels", "array", "int64", (-1,), classes=tuple(name for _, name in categories),
                  num_classes=len(categories),
                  source=f"coco:category_id as 0..C-1 by ascending id{_CATEGORIES}{table}"),
        FieldSpec("iscrowd", "array", "uint8", (-1,), source="coco:iscrowd"),
        FieldSpec("area", "array", "float32", (-1,), source="coco:area"),
        FieldSpec("image_id", "array", "int64", (), source="coco:images.id"),
    )


#: The fields a COCO source declares (the ``labels`` source then holds the file's categories).
COCO_FIELDS = _fields([])


def coco_categories(source: str) -> list[tuple[int, str]]:
    """``[(coco id, name), ...]`` in label order, from a COCO-built ``labels`` field's ``source``.

    Raises:
        OptionError: ``source`` is not one a COCO build wrote.
    """
    head, found, table = source.partition(_CATEGORIES)
    if not found or not head.startswith("coco:"):
        raise OptionError(f"expected the source of a COCO-built labels field ('coco:...{_CATEGORIES}[...]'), "
                          f"got {source[:80]!r}")
    return [(int(i), str(name)) for i, name in json.loads(table)]


def looks_like_coco(path: Path) -> bool:
    """Whether ``path`` is a COCO-style annotation file, from its start: a JSON object naming
    ``images``, ``annotations`` or ``categories`` in its first 64 KiB, or any ``.json`` file
    (``list_coco`` then says what it lacks). Manifests (``.jsonl``, ``.csv``) are not."""
    suffix = path.suffix.lower()
    if suffix in _MANIFEST_SUFFIXES:
        return False
    if suffix == ".json":
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(64 << 10)
    except OSError:
        return False
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{") and _COCO_KEY.search(head) is not None


def _is_int(value: object) -> bool:
    return type(value) is int and value in INT64


def _file_name_text(name: str) -> bool:
    """Whether ``name`` can be written out: UTF-8, or escaped raw bytes (``\\udc80``-``\\udcff``, as
    ``os.fsdecode`` spells a byte that is not UTF-8); any other surrogate is no name at all."""
    try:
        name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: Largest COCO annotation file read (``instances_train2017.json`` is 450 MB).
MAX_COCO_BYTES = 8 << 30


def _load(path: Path) -> dict[str, Any]:
    """The document: read through ``files.read_user_file`` (a regular file, bounded) with its
    nesting checked before it is parsed (COCO nests 4 levels; a hostile file 100,000)."""
    data = read_user_file(path, what="the annotation file", cap=MAX_COCO_BYTES, error=SourceError)
    if json_depth_exceeds(data, MAX_USER_JSON_DEPTH):
        raise SourceError("the annotation file nests arrays or objects too deeply to be COCO", path=path)
    try:
        document = json.loads(data)
    except RecursionError:
        raise SourceError("the annotation file nests arrays or objects too deeply to be COCO", path=path) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        hint = " (a JSON Lines manifest must be named .jsonl)" if "Extra data" in str(exc) else ""
        raise SourceError(f"not a JSON document: {exc}{hint}", path=path) from None
    del data
    if not isinstance(document, dict):
        raise SourceError(f"a COCO annotation file is a JSON object with 'images', 'annotations' and 'categories'; "
                          f"this one is a {type(document).__name__}", path=path)
    missing = [name for name in ("images", "categories") if name not in document]
    if missing:
        raise SourceError(f"a COCO annotation file is a JSON object with 'images', 'annotations' and 'categories'; "
                          f"this one lacks {missing} (members: {sorted(document)[:10]})", path=path)
    for name in ("images", "annotations", "categories"):
        if not isinstance(document.get(name, []), list):
            raise SourceError(f"COCO '{name}' must be an array, got {type(document[name]).__name__}", path=path)
    return document


def _categories(entries: list[Any], path: Path) -> list[tuple[int, str]]:
    """(id, name) of every category, in ascending id order (label order)."""
    by_id: dict[int, str] = {}
    for number, entry in enumerate(entries):
        if not isinstance(entry, dict) or not _is_int(entry.get("id")) or not isinstance(entry.get("name"), str) \
                or not entry["name"]:
            raise SourceError(f"categories[{number}] must be an object with an integer 'id' and a non-empty "
                              f"string 'name', got {_describe(entry)}", path=path)
        if lone_surrogate(entry["name"]) is not None:  # it would become a class name no file can hold
            raise SourceError(f"categories[{number}] name {entry['name']!r} holds an unpaired surrogate escape "
                              f"(not Unicode text)", path=path)
        if entry["id"] in by_id:
            raise SourceError(f"categories[{number}]: id {entry['id']} repeats (category ids must be unique)",
                              path=path)
        by_id[entry["id"]] = entry["name"]
    names = [by_id[i] for i in sorted(by_id)]
    if len(set(names)) != len(names):
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise SourceError(f"category names repeat: {repeated[:5]} (each category needs its own name)", path=path)
    return [(i, by_id[i]) for i in sorted(by_id)]


def _annotation_problem(ann: dict[str, Any], labels: dict[int, int]) -> tuple[str, tuple[float, ...], int, int, float]:
    """(problem, xyxy, label, iscrowd, area) of one annotation of a known image; problem "" when good."""
    category = ann.get("category_id")
    if not _is_int(category) or category not in labels:
        return f"category_id {_describe(category)} is not in categories", (), 0, 0, 0.0
    box = ann.get("bbox")
    if not isinstance(box, list) or len(box) != 4 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in box):
        return f"bbox must be [x, y, width, height] (four numbers), got {_describe(box)}", (), 0, 0, 0.0
    try:
        x, y, w, h = (float(v) for v in box)
    except OverflowError:  # an integer past float64
        return f"bbox {_describe(box)} holds a number too large for float32", (), 0, 0, 0.0
    corners = (x, y, x + w, y + h)
    if not all(math.isfinite(v) for v in (x, y, w, h)):
        return f"bbox {_describe(box)} holds a value that is not finite (NaN or Infinity)", (), 0, 0, 0.0
    if w < 0 or h < 0:
        return f"bbox {_describe(box)} has a negative width or height", (), 0, 0, 0.0
    if any(abs(v) > _FLOAT32_MAX for v in corners):
        return f"bbox {_describe(box)} holds a number too large for float32", (), 0, 0, 0.0
    crowd = ann.get("iscrowd", 0)
    if isinstance(crowd, bool):
        crowd = int(crowd)
    if crowd not in (0, 1) or type(crowd) is not int:
        return f"iscrowd must be 0 or 1, got {_describe(ann.get('iscrowd'))}", (), 0, 0, 0.0
    area = ann.get("area", w * h)
    if not isinstance(area, (int, float)) or isinstance(area, bool):
        return f"area must be a number, got {_describe(area)}", (), 0, 0, 0.0
    try:
        area = float(area)
    except OverflowError:
        area = math.inf
    if not math.isfinite(area) or area < 0 or area > _FLOAT32_MAX:
        return f"area must be a finite number >= 0 that fits float32, got {_describe(ann.get('area'))}", (), 0, 0, 0.0
    return "", corners, labels[category], crowd, area


def list_coco(annotations: str | os.PathLike[str], door: DoorOptions = DoorOptions()) -> RawListing:
    """List a COCO-style annotation file's images with their boxes (see the module docstring).

    Args:
        annotations: the annotation JSON (``instances_train2017.json``).
        door: ``root``: the folder the images' ``file_name`` are relative to (default: the
            file's folder); ``progress``: called with the running count of images every 10,000.

    Returns:
        The listing, with the fields of ``COCO_FIELDS`` (``labels`` holding this file's categories).

    Raises:
        SourceError: not a readable COCO document (see the module docstring), or no root folder.
        EmptySourceError: no image could be packed (naming the top reasons).
    """
    path = Path(annotations)
    root = door.source.root
    root_path = Path(root) if root is not None else path.parent
    if not root_path.is_dir():
        raise SourceError("the image folder (--root) is not a folder", path=root_path)
    document = _load(path)
    categories = _categories(document["categories"], path)
    labels = {category: label for label, (category, _) in enumerate(categories)}
    out = RawListingBuilder(door.progress)

    # images: id -> row; rows that cannot be packed are marked (a message) before the annotations
    images: list[Any] = document["images"]
    row_of: dict[int, int] = {}
    unusable: dict[int, tuple[str, str, str]] = {}
    for row, entry in enumerate(images):
        where = f"images[{row}]"
        if not isinstance(entry, dict) or not _is_int(entry.get("id")) or not isinstance(entry.get("file_name"), str) \
                or not entry["file_name"]:
            unusable[row] = (where, "bad-manifest-row", f"an image needs an integer 'id' (int64) and a non-empty "
                                                        f"string 'file_name', got {_describe(entry)}")
        elif not _file_name_text(entry["file_name"]):
            unusable[row] = (where, "undecodable-name", f"file_name {entry['file_name']!r} holds an unpaired "
                                                        f"surrogate escape (not a file name)")
        elif entry["id"] in row_of:
            unusable[row] = (entry["file_name"], "duplicate-entry",
                             f"image id {entry['id']} repeats images[{row_of[entry['id']]}] (its annotations go there)")
        else:
            row_of[entry["id"]] = row

    # annotations: checked into flat arrays (one row per kept object)
    owner, boxes, classes, crowds, areas = array("q"), array("d"), array("q"), array("B"), array("d")
    bad_images: dict[int, list[str]] = {}
    for number, ann in enumerate(document.get("annotations", [])):
        if not isinstance(ann, dict):
            out.reject(f"annotations[{number}]", ANNOTATION_REJECTION,
                       f"an annotation must be an object, got {_describe(ann)} (dropped)")
            continue
        name = f"annotation {_describe(ann.get('id'))}"
        image_id = ann.get("image_id")
        row = row_of.get(image_id) if _is_int(image_id) else None
        if row is None:
            out.reject(f"annotations[{number}]", ANNOTATION_REJECTION,
                       f"{name}: image_id {_describe(image_id)} is not in images (dropped)")
            continue
        problem, corners, label, crowd, area = _annotation_problem(ann, labels)
        if problem:
            bad_images.setdefault(row, []).append(f"{name}: {problem}")
            continue
        owner.append(row)
        boxes.extend(corners)
        classes.append(label)
        crowds.append(crowd)
        areas.append(area)
    del document  # the per-object values are in the arrays now

    rows = np.frombuffer(owner, dtype=np.int64)
    order = np.argsort(rows, kind="stable")  # each image's objects, in annotation order
    box_array = np.frombuffer(boxes, dtype=np.float64).reshape(-1, 4)[order].astype("<f4")
    label_array = np.frombuffer(classes, dtype=np.int64)[order].astype("<i8")
    crowd_array = np.frombuffer(crowds, dtype=np.uint8)[order]
    area_array = np.frombuffer(areas, dtype=np.float64)[order].astype("<f4")
    ends = np.cumsum(np.bincount(rows, minlength=len(images)))
    specs = _fields(categories)
    values = FieldRowBuilder(specs)
    for row, entry in enumerate(images):
        if row in unusable:
            out.reject(*unusable[row])
            continue
        if row in bad_images:
            problems = bad_images[row]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            out.reject(entry["file_name"], ANNOTATION_REJECTION,
                       f"{problems[0]}{more}; the image is not packed (an object left out would be trained as "
                       f"background)")
            continue
        start, end = (int(ends[row - 1]) if row else 0), int(ends[row])
        if (end - start) * 16 > MAX_VALUE_BYTES:
            out.reject(entry["file_name"], ANNOTATION_REJECTION,
                       f"{end - start} objects: over the {MAX_VALUE_BYTES // 16} boxes a sample can hold")
            continue
        key, size, reason, message = check_row_file(entry["file_name"], root_path)
        if reason:
            out.reject(key or f"images[{row}]", reason, message)
            continue
        values.add([box_array[start:end].tobytes(), label_array[start:end].tobytes(),
                    crowd_array[start:end].tobytes(), area_array[start:end].tobytes(),
                    np.int64(entry["id"]).astype("<i8").tobytes()])
        out.add(key.encode("utf-8"), size)  # no main label: a detection image has no one class
    hints = []
    if root is None and any(r.reason == "missing" for r in out.rejected):
        hints.append(f"file_name paths are relative to --root (default: the annotation file's folder "
                     f"{path.parent}); pass the image folder, e.g. --root train2017/")
    return out.finish(root_path, "coco", fields=values.finish(), declared_unlabeled=True, empty_what="the COCO file lists no usable image",
                      empty_path=path, empty_hints=tuple(hints))
