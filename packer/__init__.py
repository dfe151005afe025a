"""packer: pack image datasets into large aligned shards with flat indexes; read them back fast.

``import packer`` imports numpy and the format, never torch, kvikio or DALI.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import *  # noqa: F401,F403  (the error classes are part of the public API)
from .errors import __all__ as _error_names

__all__ = ["__version__", "open_dataset", "open_index", "build_dataset", "append_dataset", "verify_dataset",
           "ReadOrder", *_error_names]


def __getattr__(name: str):  # lazy: keep `import packer` cheap
    if name in ("open_dataset", "open_index", "Dataset"):
        from . import dataset
        return getattr(dataset, name)
    if name == "build_dataset":
        from .writer import build
        return build
    if name == "append_dataset":
        from .writer.append import append
        return append
    if name == "verify_dataset":
        from .verify import verify
        return verify
    if name == "ReadOrder":  # which samples come in which order for whom: every reader's order= value
        from .order import ReadOrder
        return ReadOrder
    raise AttributeError(f"module 'packer' has no attribute {name!r}")
