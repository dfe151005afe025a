"""packer: pack image datasets into large aligned shards with flat indexes; read them back fast.

``import packer`` imports numpy and the format, never torch, kvikio or DALI.
"""

from __future__ import annotations

from ._version import __version__
from .errors import *  # noqa: F401,F403  (the error classes are part of the public API)
from .errors import __all__ as _error_names

__all__ = ["__version__", "open_dataset", "open_index", "build_dataset", "append_dataset", "verify_dataset",
           "ReadOrder", "find_duplicates", "Writer", "pack", "view", "Mixture", "Stream",
           "BuildSettings", "SourceSettings", "LayoutSettings", "CheckSettings", "LabelSettings", "RunOptions",
           *_error_names]

#: What ``packer.build_dataset`` takes: what a build records, nested, and how one run of it runs.
_SETTINGS = ("BuildSettings", "SourceSettings", "LayoutSettings", "CheckSettings", "LabelSettings", "RunOptions")


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
    if name in _SETTINGS:
        from .writer import settings
        return getattr(settings, name)
    if name == "verify_dataset":
        from .verify import verify
        return verify
    if name == "ReadOrder":  # which samples come in which order for whom: every reader's order= value
        from .order import ReadOrder
        return ReadOrder
    if name == "Writer":
        from .writer.python_writer import Writer
        return Writer
    if name == "pack":
        from .writer.map_pack import pack
        return pack
    if name == "find_duplicates":
        from .duplicates import find_duplicates
        return find_duplicates
    if name in ("Mixture", "Stream"):  # several datasets read as one, each taking its share of an epoch
        from . import mixture
        return getattr(mixture, name)
    if name == "view":  # a subset of a dataset, by selectors, as a small view file
        from .views import view
        return view
    raise AttributeError(f"module 'packer' has no attribute {name!r}")
