"""Making views: ``packer.view`` selects samples of a dataset and writes a view file (``packer.viewfile``).

Selectors, all optional and all applied together (a sample is kept when every one keeps it):

- ``classes``: class names (or label numbers) to keep;
- ``keys``: a file listing keys, one per line, or a list of keys (a listed key the dataset does
  not hold is an error naming it);
- ``where``: conditions ``"FIELD OP VALUE"`` on the index (``label``, ``class``, ``key``,
  ``width``, ``height``, ``channels``, ``size``, ``format``, or a declared scalar ``array`` or
  ``text`` field), ``OP`` one of ``== != < <= > >=``;
- ``split``: fractions (``"0.9:0.1"``); each sample goes to part ``k`` by a stable hash of its key
  and ``seed`` (xxh3-64 of the key's UTF-8 bytes with the seed, over 2**64, against the running
  sums of the fractions), so the parts never exchange samples when the dataset is appended to,
  and whatever the order of the rows; one view file per part (``split_paths`` names them);
- ``exclude_duplicates_of``: another dataset or view; samples with an exact or near copy in it
  are left out (``packer.find_duplicates``).

A view of a view selects among the view's samples and is written against the view's base, so
views never chain at read time.
"""

from __future__ import annotations

import operator
import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import xxhash

from . import format as fmt
from .dataset import Dataset, open_dataset
from .errors import OptionError, OutputExistsError
from .location import Location, parse_location
from .viewfile import SUFFIX, ViewFile, encode_view, rows_checksum

__all__ = ["view", "split_paths", "parse_split", "parse_where", "split_parts", "WHERE_FIELDS"]

#: ``where`` operators.
_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*(==|!=|<=|>=|<|>)\s*(.*?)\s*$")
#: The index's own fields ``where`` reads (besides declared scalar fields).
WHERE_FIELDS = ("label", "class", "key", "width", "height", "channels", "size", "format")
#: The most parts a split makes.
MAX_SPLIT_PARTS = 100


def parse_split(split: str | Sequence[float]) -> tuple[float, ...]:
    """``"0.9:0.1"`` (or a sequence of numbers) as fractions that sum to 1.

    Raises:
        OptionError: not numbers, a fraction not above 0, more than 100 parts, or a sum other than 1.
    """
    text = split if isinstance(split, str) else ":".join(str(part) for part in split)
    try:
        parts = tuple(float(part) for part in (split.split(":") if isinstance(split, str) else split))
    except (TypeError, ValueError):
        raise OptionError(f"--split takes fractions separated by ':' (e.g. 0.9:0.1), got {text!r}") from None
    if not 2 <= len(parts) <= MAX_SPLIT_PARTS or any(not part > 0 or part != part for part in parts):
        raise OptionError(f"--split takes 2 to {MAX_SPLIT_PARTS} fractions above 0 (e.g. 0.9:0.1), got {text!r}")
    if abs(sum(parts) - 1.0) > 1e-6:
        raise OptionError(f"--split fractions must sum to 1, got {text!r} (sum {sum(parts):g})")
    return parts


def split_parts(keys: Sequence[str], fractions: Sequence[float], seed: int) -> np.ndarray:
    """The part (0-based) of each key: ``xxh3_64(key, seed) / 2**64`` against the running sums of
    ``fractions`` (the last part takes what rounding leaves)."""
    hashes = np.fromiter((xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogateescape"), seed) for key in keys),
                         dtype=np.uint64, count=len(keys))
    bounds = np.cumsum(fractions)[:-1]
    edges = np.array([min(int(b * 2.0 ** 64), 2 ** 64 - 1) for b in bounds], dtype=np.uint64)
    return np.searchsorted(edges, hashes, side="right").astype(np.int64)


def split_paths(out: str | os.PathLike[str], parts: int) -> list[Path]:
    """The files a split into ``parts`` writes for ``OUT``: part ``k`` is ``OUT`` with ``-k`` before
    its ``.pkview`` suffix (the suffix added when missing): ``cut/train.pkview`` gives
    ``cut/train-0.pkview``, ``cut/train-1.pkview``, ..."""
    path = Path(out)
    stem = path.name[:-len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    return [path.with_name(f"{stem}-{k}{SUFFIX}") for k in range(parts)]


def parse_where(text: str) -> tuple[str, str, str]:
    """``"FIELD OP VALUE"`` as its three parts.

    Raises:
        OptionError: not of that form.
    """
    match = _WHERE.match(text) if isinstance(text, str) else None
    if match is None or not match.group(3):
        raise OptionError(f"--where takes 'FIELD OP VALUE' with OP one of {list(_OPERATORS)} (e.g. 'width >= 64'), "
                          f"got {text!r}")
    return match.group(1), match.group(2), match.group(3)


def _number(field: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise OptionError(f"--where: {field} is a number, got {value!r}") from None


def _where_mask(dataset: Dataset, text: str) -> np.ndarray:
    field, op, value = parse_where(text)
    compare = _OPERATORS[op]
    ix = dataset.index
    numeric = {"label": ix.label, "width": ix.width, "height": ix.height, "channels": ix.channels, "size": ix.size}
    if field in numeric:
        return np.asarray(compare(np.asarray(numeric[field]).astype(np.float64), _number(field, value)), dtype=bool)
    strings: list[str] | None = None
    if field == "class":
        names = np.asarray(list(dataset.classes) + [""], dtype=object)
        labels = np.asarray(ix.label)
        strings = names[np.where((labels >= 0) & (labels < len(dataset.classes)), labels, len(dataset.classes))].tolist()
    elif field == "key":
        strings = list(dataset.keys())
    elif field == "format":
        codes = np.asarray(ix.image_format).tolist()
        strings = [fmt.ImageFormat.NAMES.get(int(code), "unknown") for code in codes]
    else:
        spec = next((s for s in dataset.fields if s.name == field), None)
        if spec is None:
            have = list(WHERE_FIELDS) + [s.name for s in dataset.fields]
            raise OptionError(f"--where: no field {field!r}; fields are {have}")
        if spec.kind == "array" and not spec.variable and int(np.prod(spec.shape or (1,))) == 1:
            values = dataset.field_array(field).reshape(len(dataset)).astype(np.float64)
            return np.asarray(compare(values, _number(field, value)), dtype=bool)
        if spec.kind == "text":
            strings = [dataset.field_value(field, i) for i in range(len(dataset))]
        else:
            raise OptionError(f"--where: field {field!r} ({spec.describe()}) holds more than one value per sample; "
                              f"where compares scalar array fields and text fields")
    if op not in ("==", "!="):
        raise OptionError(f"--where: {field} is text: compare it with == or !=, got {op!r}")
    literal = value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value
    hit = np.fromiter((s == literal for s in strings), dtype=bool, count=len(strings))
    return hit if op == "==" else ~hit


def _keys_mask(dataset: Dataset, keys: str | os.PathLike[str] | Sequence[str]) -> np.ndarray:
    from .export.select import read_keys_file

    if isinstance(keys, (str, os.PathLike, Location)):
        wanted = set(read_keys_file(keys))
        source = os.fspath(keys) if not isinstance(keys, Location) else keys.display
    else:
        wanted = set(keys)
        source = "the list"
    present = np.fromiter((key in wanted for key in dataset.keys()), dtype=bool, count=len(dataset))
    missing = wanted.difference(dataset.key(i) for i in np.flatnonzero(present).tolist())
    if missing:
        first = sorted(missing)[:5]
        raise OptionError(f"--keys: {len(missing)} of the {len(wanted)} keys in {source} are not in this dataset "
                          f"(first: {', '.join(repr(k) for k in first)}); keys are spelled as the dataset stores them")
    return present


def _classes_mask(dataset: Dataset, classes: str | Sequence[str | int]) -> np.ndarray:
    names = list(dataset.classes)
    asked = [c.strip() for c in classes.split(",") if c.strip()] if isinstance(classes, str) else list(classes)
    if not asked:
        raise OptionError("--classes: give at least one class")
    wanted = []
    for name in asked:
        if isinstance(name, str) and name in names:
            wanted.append(names.index(name))
        elif isinstance(name, str) and name.isdigit() and int(name) < max(len(names), 1):  # a label number
            wanted.append(int(name))
        elif isinstance(name, (int, np.integer)) and not isinstance(name, bool) and 0 <= name < max(len(names), 1):
            wanted.append(int(name))
        else:
            raise OptionError(f"--classes: {name!r} is not a class of this dataset "
                              f"({', '.join(names[:10])}{', ...' if len(names) > 10 else ''})")
    return np.isin(np.asarray(dataset.labels), np.asarray(wanted, dtype=np.int64))


def _same_base(a: Dataset, b: Dataset) -> bool:
    return a.manifest.index.checksum == b.manifest.index.checksum and a.place.folder == b.place.folder


def _duplicates_mask(dataset: Dataset, base: Dataset, rows: np.ndarray, other_location: Any,
                     remote: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """Which of ``rows`` (of ``base``) have no exact or near copy in the other dataset or view."""
    from .duplicates import find_duplicates

    other = open_dataset(other_location, remote=remote) if not isinstance(other_location, Dataset) else other_location
    try:
        other_rows = other.base_rows
        other_base = open_dataset(other.view.base_location(other.location), remote=remote) if other.view else other
        try:
            same = _same_base(base, other_base)
            # The hashes are the bases' (a view has none of its own): the report's groups are read
            # back through both selections.
            report = find_duplicates(base, () if same else [other_base], store_hashes=True, remote=remote)
            theirs = set((np.arange(len(other_base)) if other_rows is None else other_rows).tolist())
            them = 0 if same else 1
            drop: set[int] = set()
            for group in report.groups:
                copies = {m.sample for m in group.members if m.dataset == them and m.sample in theirs}
                if not copies:
                    continue
                drop.update(m.sample for m in group.members
                            if m.dataset == 0 and (not same or copies - {m.sample}))
        finally:
            if other_base is not other:
                other_base.close()
    finally:
        if other is not other_location:
            other.close()
    keep = ~np.isin(rows, np.fromiter(drop, dtype=np.int64, count=len(drop)))
    return keep, {"exclude_duplicates_of": other.location if isinstance(other_location, Dataset)
                  else parse_location(other_location, what="--exclude-duplicates-of").display,
                  "removed": int((~keep).sum())}


def _base_text(base: Location, out: Path) -> str:
    """The base's location as a view file records it: a URL as given, a folder relative to the view."""
    if base.url is not None:
        return base.text
    target = os.path.abspath(base.local_path())
    try:
        return os.path.relpath(target, os.path.dirname(os.path.abspath(out)))
    except ValueError:  # another drive (Windows)
        return target


def view(dataset: str | os.PathLike[str] | Dataset, out: str | os.PathLike[str], *,
         classes: str | Sequence[str | int] | None = None, keys: str | os.PathLike[str] | Sequence[str] | None = None,
         where: str | Sequence[str] | None = None, split: str | Sequence[float] | None = None, seed: int = 0,
         exclude_duplicates_of: Any = None, overwrite: bool = False, remote: Any = None) -> list[Path]:
    """Write a view of ``dataset``: the samples every given selector keeps (module docstring).

    Args:
        dataset: a dataset folder, URL, view file, or an open ``Dataset``.
        out: the view file to write (a local path); with ``split``, the stem of one file per part
            (``split_paths``).
        classes, keys, where, split, seed, exclude_duplicates_of: the selectors.
        overwrite: replace existing view files.
        remote: ``RemoteOptions`` for datasets at URLs.

    Returns:
        The view files written (one, or one per part of a split), each opened by ``open_dataset``.

    Raises:
        OptionError: a bad selector, or ``out`` is a URL. OutputExistsError: a view file exists.
    """
    out_path = parse_location(out, what="OUT").local_path("a view file is written to a local path")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 64:
        raise OptionError(f"--seed must be an integer from 0 to 2**64-1, got {seed!r}")
    fractions = parse_split(split) if split is not None else None
    targets = split_paths(out_path, len(fractions)) if fractions else [out_path]
    for target in targets:
        if not overwrite and target.exists():
            raise OutputExistsError(f"{target} exists: pass overwrite=True (--overwrite) to replace it")
        if target.is_dir():
            raise OptionError(f"OUT: {target} is a folder; a view is a file (e.g. {target}{SUFFIX})")
    owned = not isinstance(dataset, Dataset)
    ds = open_dataset(dataset, remote=remote) if owned else dataset
    try:
        base_location = parse_location(ds.view.base_location(ds.location) if ds.view is not None else ds.location,
                                       what="the dataset")
        base = open_dataset(base_location, remote=remote) if ds.view is not None else ds
        try:
            rows = ds.base_rows if ds.base_rows is not None else np.arange(len(ds), dtype=np.int64)
            keep = np.ones(len(ds), dtype=bool)
            selectors: list[dict[str, Any]] = []
            if ds.view is not None:
                selectors.append({"view_of": ds.location, "selectors": list(ds.view.selectors)})
            if classes is not None:
                keep &= _classes_mask(ds, classes)
                selectors.append({"classes": classes.split(",") if isinstance(classes, str) else list(classes)})
            if keys is not None:
                keep &= _keys_mask(ds, keys)
                selectors.append({"keys": os.fspath(keys) if isinstance(keys, (str, os.PathLike)) else len(keys)})
            for condition in ([where] if isinstance(where, str) else list(where or ())):
                keep &= _where_mask(ds, condition)
                selectors.append({"where": condition})
            if exclude_duplicates_of is not None:
                mask, record = _duplicates_mask(ds, base, rows, exclude_duplicates_of, remote)
                keep &= mask
                selectors.append(record)
            parts = split_parts(list(ds.keys()), fractions, int(seed)) if fractions else np.zeros(len(ds), np.int64)
            identity = {"base_samples": len(base), "rows_checksum": rows_checksum(base.index, len(base)),
                        "index_checksum": base.manifest.index.checksum}
            written = []
            for part, target in enumerate(targets):
                chosen = rows[keep & (parts == part)]
                record = selectors + ([{"split": list(fractions), "seed": int(seed), "part": part}] if fractions else [])
                data = encode_view(ViewFile(base=_base_text(base_location, target), selected=chosen.astype(np.uint64),
                                            selectors=tuple(record), **identity))
                _write_atomically(target, data)
                written.append(target)
            return written
        finally:
            if base is not ds:
                base.close()
    finally:
        if owned:
            ds.close()


def _write_atomically(target: Path, data: bytes) -> None:
    """The view file through packer's one atomic write (unique temp name, fsync, rename, folder fsync)."""
    from ._internal.atomic import write_atomic

    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, [data])
