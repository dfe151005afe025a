"""Class lists: one label meaning across splits (``--classes``), their checksum, and the check.

A class list is the tuple of class names; label ``i`` means ``classes[i]``. Two datasets that
will be used together (train and val, or a model and its evaluation set) must share it exactly,
else a label silently means a different class. ``packer build --classes`` fixes the list before
listing; ``check_classes`` refuses two datasets (or a dataset and a list) that disagree.

The class-list checksum (``packer.format.class_list_checksum``, re-exported here) is the xxh3-64
of the names, each encoded as UTF-8 and followed by one ``\\n`` byte, in label order: the same
list gives the same checksum on every machine; reordering or renaming any class changes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from .errors import ClassListMismatchError, OptionError
from ._internal.files import read_user_file, read_user_json
from .format import class_list_checksum
from .location import parse_location
from .remote.url import is_url

__all__ = ["SPLIT_NAMES", "class_list_checksum", "check_classes", "load_class_list", "classes_of",
           "split_folder_warning"]

#: Folder names that are dataset splits, not classes (compared case-insensitively).
SPLIT_NAMES = frozenset({"train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval"})

#: A class list larger than this is refused as an option (a mistake, like a manifest given as the list).
MAX_CLASSES = 1 << 20
MAX_CLASS_FILE_BYTES = 64 << 20


def _checked(names: Sequence[Any], where: str) -> tuple[str, ...]:
    if not names:
        raise OptionError(f"{where}: the class list is empty")
    if len(names) > MAX_CLASSES:
        raise OptionError(f"{where}: {len(names)} classes is over the limit of {MAX_CLASSES}")
    out: list[str] = []
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name:
            raise OptionError(f"{where}: class names must be non-empty strings, got {name!r}")
        if "\n" in name or "\x00" in name:
            raise OptionError(f"{where}: class name {name!r} holds a newline or NUL")
        if name in seen:
            raise OptionError(f"{where}: class {name!r} is listed twice")
        seen.add(name)
        out.append(name)
    return tuple(out)


def load_class_list(spec: str | os.PathLike[str] | Sequence[str], *, what: str = "classes") -> tuple[str, ...]:
    """A class list from ``--classes``: a file, or names separated by commas, or a sequence
    (``what`` names where the sequence came from in messages: ``--classes-from DATASET``).

    A file is read as a JSON list of names when it ends in ``.json``, else as one name per line
    (blank lines skipped, surrounding whitespace stripped: a class folder name never ends in a
    space by accident, a hand-written list often does). The order given is the label order.

    Raises:
        OptionError: unreadable file, empty list, duplicate or empty names.
    """
    if not isinstance(spec, (str, os.PathLike)):
        return _checked(list(spec), what)
    given = spec
    if isinstance(spec, str) and (is_url(spec) or "," not in spec):  # may name a file: a local one only
        spec = parse_location(spec, what="--classes").local_path(
            "a class list is read from a local file (or give the names, like a,b,c)")
    path = Path(spec)
    if path.exists() and not path.is_dir():  # a file (a FIFO or a device is refused, never read)
        what = "--classes"
        if path.suffix.lower() == ".json":
            names = read_user_json(path, what=what, cap=MAX_CLASS_FILE_BYTES)
            if not isinstance(names, list):
                raise OptionError(f"--classes {path}: expected a JSON list of class names")
            return _checked(names, f"--classes {path}")
        data = read_user_file(path, what=what, cap=MAX_CLASS_FILE_BYTES)
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise OptionError(f"--classes {path}: cannot read the class list (not UTF-8: {exc.reason})") from None
        return _checked([line.strip() for line in text.splitlines() if line.strip()], f"--classes {path}")
    text = os.fspath(given)
    if "," not in text and ("/" in text or text.endswith((".txt", ".json"))):
        raise OptionError(f"--classes {text}: no such file (give a file of class names, or names like a,b,c)")
    return _checked([name.strip() for name in text.split(",") if name.strip()], "--classes")


def classes_of(source: Any) -> tuple[str, ...]:
    """The class list of a dataset folder, an open dataset or index, a ``PackedDataset``, or a list."""
    if isinstance(source, (str, os.PathLike)):
        from .dataset import open_index

        with open_index(source) as index:
            return tuple(index.classes)
    classes = getattr(source, "classes", None)
    if classes is None:
        if isinstance(source, Sequence):
            return tuple(source)
        raise OptionError(f"expected a dataset, a dataset path or a list of class names, got {type(source).__name__}")
    return tuple(classes)


def _name(source: Any, fallback: str) -> str:
    path = getattr(source, "path", None) or getattr(getattr(source, "dataset", None), "path", None)
    if isinstance(source, (str, os.PathLike)):
        path = source
    return str(path) if path is not None else fallback


def check_classes(expected: Any, actual: Any) -> tuple[str, ...]:
    """Refuse two class lists that disagree; returns the (shared) list.

    Args:
        expected: the reference (e.g. the training set): a dataset, its path, or a list of names.
        actual: the one to check (e.g. the validation set), same kinds.

    Returns:
        The class list, when both agree exactly (same names, same order).

    Raises:
        ClassListMismatchError: naming the classes missing, extra or numbered differently, and
            how to rebuild with the right list.
    """
    want, got = classes_of(expected), classes_of(actual)
    if want == got:
        return want
    a, b = _name(expected, "the expected list"), _name(actual, "the other dataset")
    missing = [c for c in want if c not in set(got)]
    extra = [c for c in got if c not in set(want)]
    where = {name: i for i, name in enumerate(got)}
    moved = [(c, i, where[c]) for i, c in enumerate(want) if c in where and where[c] != i]
    parts = []
    if not want or not got:
        parts.append(f"{a if not want else b} has no class names (integer labels)")
    if missing:
        parts.append(f"{b} lacks {_few(missing)}")
    if extra:
        parts.append(f"{b} has extra {_few(extra)}")
    if moved:
        c, i, j = moved[0]
        parts.append(f"{len(moved)} class(es) have other labels, e.g. {c!r} is {i} in {a} but {j} in {b}")
    fix = (f"`packer build ... --classes-from {a}`" if isinstance(expected, (str, os.PathLike)) or
           hasattr(expected, "path") or hasattr(expected, "dataset") else "`packer build ... --classes FILE`")
    raise ClassListMismatchError(
        f"class lists disagree ({len(want)} vs {len(got)} classes; checksums {class_list_checksum(want)} vs "
        f"{class_list_checksum(got)}): {'; '.join(parts)}. Labels would mean different classes; rebuild {b} "
        f"with {fix} so both use one list")


def _few(names: Sequence[str], shown: int = 5) -> str:
    head = ", ".join(repr(n) for n in names[:shown])
    return f"[{head}{', ...' if len(names) > shown else ''}] ({len(names)})"


def split_folder_warning(class_names: Sequence[str]) -> str | None:
    """A warning when an image folder's "classes" look like splits (train/, val/), else None.

    Building the parent of ``train/`` and ``val/`` makes the split the label: almost never meant.
    """
    splits = [name for name in class_names if name.lower() in SPLIT_NAMES]
    if not splits or (len(splits) < 2 and len(splits) < len(class_names)):
        return None
    return (f"the class folders {_few(splits)} look like dataset splits, not classes: the labels will be the "
            f"split. Build each split on its own with one class list, e.g. `packer build SRC/{splits[0]} OUT-"
            f"{splits[0]}` then `packer build SRC/<other split> OUT-<other split> --classes-from OUT-{splits[0]}`")
