"""How labels are read: ``--label-type`` (``auto``, ``int``, ``str``), strict integers, and the
reader that numbers class names (sorted, or by a given class list)."""

from __future__ import annotations

import re
from array import array
from pathlib import Path

import numpy as np

from ..errors import OptionError, SourceError


class _LabelReader:
    """Turns manifest labels into int64 labels, by ``label_type`` (see ``LABEL_TYPES``).

    Class names are numbered in order of first appearance while streaming and renumbered by
    sorted name at the end (``finish``), unless a class list was given: then the list numbers them.
    """

    def __init__(self, label_type: str, classes: tuple[str, ...] | None, manifest: Path) -> None:
        self.label_type = "str" if label_type == "auto" and classes is not None else label_type
        self.given = classes
        self.class_ids: dict[str, int] = {name: i for i, name in enumerate(classes)} if classes else {}
        self.manifest = manifest
        self.first_int: tuple[int, object] | None = None
        self.first_name: tuple[int, object] | None = None

    def read(self, label: object, number: int) -> tuple[int | None, str, str]:
        """(label value, rejection reason, message); value None when rejected."""
        if isinstance(label, list):
            return None, "bad-manifest-row", (f"label {label!r} is a list (multi-label): a sample has one "
                                              f"integer label; put the list in metadata")
        if label is None or label == "" or isinstance(label, (bool, float, dict)):
            return None, "bad-manifest-row", f"label must be an integer or a class name, got {label!r}"
        if self.label_type == "str":
            return self._name(str(label), number)
        integer = label if isinstance(label, int) else _strict_int(label)  # label is a str here
        if integer is None:
            if self.label_type == "int":
                return None, "bad-manifest-row", (f"label {label!r} is not an integer (--label-type int: plain "
                                                  f"ASCII digits with an optional '-', nothing else)")
            if loose_int(label):
                return None, "bad-manifest-row", (
                    f"label {label!r} looks like an integer but is not plain ASCII digits (spaces, '_', '+', "
                    f"leading zeros or non-ASCII digits): packer reads labels strictly; fix the row, or pass "
                    f"--label-type str to use every label as a class name")
            return self._name(label, number)
        if not -(1 << 63) <= integer < (1 << 63):
            return None, "bad-manifest-row", f"label {integer} does not fit in a signed 64-bit integer"
        if self.given is not None and not 0 <= integer < len(self.given):
            return None, "unknown-class", f"label {integer} is outside the {len(self.given)} classes given"
        self.first_int = self.first_int or (number, label)
        self._check_mix(number)
        return integer, "", ""

    def _name(self, name: str, number: int) -> tuple[int | None, str, str]:
        self.first_name = self.first_name or (number, name)
        self._check_mix(number)
        if self.given is not None:
            value = self.class_ids.get(name)
            if value is None:
                return None, "unknown-class", f"class {name!r} is not in the class list (--classes)"
            return value, "", ""
        return self.class_ids.setdefault(name, len(self.class_ids)), "", ""

    def _check_mix(self, number: int) -> None:
        if self.first_int is not None and self.first_name is not None:
            (i_line, i_label), (n_line, n_label) = self.first_int, self.first_name
            raise SourceError(f"manifest mixes integer labels (line {i_line}: {i_label!r}) and class-name labels "
                              f"(line {n_line}: {n_label!r}); use one kind, or pass --label-type str to read "
                              f"every label as a class name", path=self.manifest)

    @property
    def kind(self) -> str:
        """``"int"`` or ``"str"``: what the labels were read as."""
        return "str" if self.label_type == "str" or self.first_name is not None else "int"

    def finish(self, labels: array) -> tuple[tuple[str, ...], array]:
        """(classes, labels renumbered to the sorted class order)."""
        if self.given is not None:
            return self.given, labels
        if self.kind == "int":
            return (), labels
        classes = tuple(sorted(self.class_ids, key=str.encode))
        remap = np.empty(len(self.class_ids), dtype=np.int64)
        for sorted_id, name in enumerate(classes):
            remap[self.class_ids[name]] = sorted_id
        values = np.frombuffer(labels, dtype=np.int64)
        return classes, (array("q", remap[values].tobytes()) if len(values) else labels)


#: How manifest labels are read (``--label-type``):
#: ``auto`` (default): labels that are all integers (JSON integers, or CSV text of plain ASCII
#: digits with an optional ``-``: no spaces, ``_``, ``+``, leading zeros or other scripts' digits)
#: stay integers; labels that are all other strings are class names, numbered in sorted order;
#: a mix is an error; a label that only *looks* like an integer (``" 1 "``, ``"1_000"``, ``"١"``)
#: is rejected with a reason. With ``--classes``, ``auto`` means ``str``.
#: ``int``: every label must be an integer (else the row is rejected).
#: ``str``: every label is a class name, as written (``"1"`` and ``" 1 "`` are two classes).
LABEL_TYPES = ("auto", "int", "str")


def check_label_type(label_type: str) -> str:
    """Raises OptionError unless ``label_type`` is one of ``LABEL_TYPES``."""
    if label_type not in LABEL_TYPES:
        raise OptionError(f"--label-type must be one of {', '.join(LABEL_TYPES)}, got {label_type!r}")
    return label_type


_STRICT_INT = re.compile(r"-?(0|[1-9][0-9]*)\Z")


def _strict_int(text: str) -> int | None:
    """The integer ``text`` spells in plain ASCII digits (``-12``), else None (``" 1 "``, ``"1_000"``)."""
    if len(text) > 20 or not _STRICT_INT.match(text):
        return None
    return int(text)


def loose_int(text: str) -> bool:
    """True when Python's ``int()`` would read ``text`` (spaces, ``_``, ``+``, Unicode digits)."""
    try:
        int(text)
    except ValueError:
        return False
    return True
