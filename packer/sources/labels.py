"""``--label-type`` (``auto``, ``int``, ``str``) and strict integers: the words of the label rules
that the source contract (``contract.py``) applies to every door."""

from __future__ import annotations

import re

from ..errors import OptionError


#: How text labels are read (``--label-type``), for every door (``contract.py``):
#: ``auto`` (default): labels that are all integers (JSON integers, or CSV text of plain ASCII
#: digits with an optional ``-``: no spaces, ``_``, ``+``, leading zeros or other scripts' digits)
#: stay integers; labels that are all other strings are class names, numbered in sorted order;
#: a mix is an error; a label that only *looks* like an integer (``" 1 "``, ``"1_000"``, ``"١"``)
#: is rejected with a reason. With ``--classes``, ``auto`` reads text as class names (an integer
#: the source types as one, a JSON number or a WebDataset ``.cls``, then indexes the list).
#: ``int``: every label must be an integer (else the row is rejected).
#: ``str``: every label is a class name, as written (``"1"`` and ``" 1 "`` are two classes).
LABEL_TYPES = ("auto", "int", "str")


def check_label_type(label_type: str) -> str:
    """Raises OptionError unless ``label_type`` is one of ``LABEL_TYPES``."""
    if label_type not in LABEL_TYPES:
        raise OptionError(f"--label-type must be one of {', '.join(LABEL_TYPES)}, got {label_type!r}")
    return label_type


#: An integer label spelled strictly: plain ASCII digits, an optional ``-``, no leading zeros.
#: The labels an index can hold (int64): a label outside is rejected with ``LABEL_REJECTION``.
INT64 = range(-(1 << 63), 1 << 63)
#: The rejection reason of a sample whose label is not an int64 or a class name.
LABEL_REJECTION = "bad-label"

STRICT_INT = re.compile(r"-?(0|[1-9][0-9]*)\Z")


def loose_int(text: str) -> bool:
    """True when Python's ``int()`` would read ``text`` (spaces, ``_``, ``+``, Unicode digits)."""
    try:
        int(text)
    except ValueError:
        return False
    return True
