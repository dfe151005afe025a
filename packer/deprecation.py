"""How packer retires a spelling: one ``DeprecationWarning`` that names the new spelling and points
at the caller's line, the first frame outside packer (however deep inside packer it was raised)."""

from __future__ import annotations

import sys
import warnings

__all__ = ["warn_deprecated"]


def _outside_packer() -> int:
    """``warnings.warn``'s ``stacklevel``, called in ``warn_deprecated``, for the first frame outside
    packer: level 1 is ``warn_deprecated``, level 2 its caller (``sys._getframe(2)`` from here)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("packer."):
        frame, level = frame.f_back, level + 1
    return level


def warn_deprecated(message: str) -> None:
    """Warn that a spelling is deprecated: ``message`` says what to write instead.

    The warning names the user's line (Python shows a ``DeprecationWarning`` by default when that
    line is in ``__main__``), not the reader that noticed the old spelling.
    """
    warnings.warn(message, DeprecationWarning, stacklevel=_outside_packer())
