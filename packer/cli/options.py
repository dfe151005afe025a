"""Options shared by several commands, defined once with the same types and ranges everywhere.

Every numeric option has a click range type, so a bad value (``--workers 0``, ``--seed -1``,
``--max-pixels 0``) is a usage error (exit 2) that names the option, never a traceback from deep
inside the library. Sizes accept ``512M``, ``1G``, ``64KiB`` or a plain number of bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

__all__ = ["SIZE", "SizeType", "ALIGNMENT", "AlignmentType", "PathType", "path_type", "LocationType", "location_type", "option_name", "POSITIVE_FLOAT", "PositiveFloat", "MAX_SEED", "workers_option", "json_option", "quiet_option", "verbose_option",
           "seed_option", "root_option", "max_pixels_option", "max_file_size_option"]

#: Seeds are unsigned 64-bit (what numpy's generators accept).
MAX_SEED = (1 << 64) - 1
#: Largest size any size option takes (the format's file-size limit, 2^62).
_MAX_SIZE = 1 << 62

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class SizeType(click.ParamType):
    """A byte count written as ``4096``, ``64K``, ``512M``, ``1G``, ``2T`` (``KiB``/``KB`` too)."""

    name = "size"
    _UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value)
            cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
            digits, unit = cleaned, ""
            if cleaned and cleaned[-1] in self._UNITS:
                digits, unit = cleaned[:-1], cleaned[-1]
            try:
                amount = float(digits)
                if amount != amount or amount in (float("inf"), float("-inf")):
                    raise ValueError(text)
                number = int(amount * self._UNITS[unit])
            except (ValueError, OverflowError):
                self.fail(f"{text!r} is not a size like 512M, 1G or 4096", param, ctx)
        if not 1 <= number <= _MAX_SIZE:
            self.fail(f"{value!r} is out of range: expected 1 byte to 2^62 bytes", param, ctx)
        return number


SIZE = SizeType()


class AlignmentType(click.ParamType):
    """``auto`` (the writer chooses from the payload sizes) or a number of bytes (``4096``, ``4K``).

    Whether a number is a power of two is the settings' rule (``LayoutSettings.check``), not repeated here.
    """

    name = "alignment"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if isinstance(value, str) and not value.strip()[:1].isdigit():
            self.fail(f"{value!r} is neither 'auto' nor a number of bytes like 64 or 4096", param, ctx)
        return SIZE.convert(value, param, ctx)


ALIGNMENT = AlignmentType()


class PathType(click.Path):
    """``click.Path`` that also refuses an empty string (``Path("")`` is ``.``, the working folder)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path is not allowed (it would mean the current folder)", param, ctx)
        return super().convert(value, param, ctx)


def option_name(param: click.Parameter | None) -> str:
    """How the user named ``param``: ``--html`` for an option, ``OUT`` for an argument."""
    if isinstance(param, click.Option) and param.opts:
        return max(param.opts, key=len)
    if param is not None:
        return param.human_readable_name
    return "the path"


class LocationType(PathType):
    """A place the user names, parsed once by ``packer.location.parse_location`` (a local path or a URL).

    ``local_only``: the value is a ``pathlib.Path``, and a URL is refused (exit 2) with a message
    naming the option and the URL (``Location.local_path``), never taken for a folder named
    ``s3:``. Otherwise the value is a ``packer.location.Location``: a URL goes to the library as
    it is, a local path gets ``click.Path``'s checks (``exists``, ``file_okay``, ...).
    ``dataset_folder``: a local ``.../manifest.json`` names its folder.
    """

    def __init__(self, *, local_only: bool = False, why: str = "", dataset_folder: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.local_only = local_only
        self.why = why
        self.dataset_folder = dataset_folder

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ..errors import OptionError
        from ..format import MANIFEST_NAME
        from ..location import parse_location

        if isinstance(value, str) and not value.strip():
            self.fail("an empty path is not allowed (it would mean the current folder)", param, ctx)
        try:
            location = parse_location(value, what=option_name(param))
            if self.local_only:
                return super().convert(location.local_path(self.why), param, ctx)
        except OptionError as exc:  # its message names the option: not click's "Invalid value for ..." again
            raise click.UsageError(exc.message, ctx) from None

        def local(path: Path) -> Path:
            checked = Path(super(LocationType, self).convert(path, param, ctx))
            if self.dataset_folder and checked.name == MANIFEST_NAME and checked.is_file():
                return checked.parent
            return checked

        return location.check_local(local)


def location_type(*, why: str = "", dataset_folder: bool = False, **kwargs: Any) -> LocationType:
    """A ``LocationType`` yielding a ``packer.location.Location`` (a local path or a URL); ``kwargs``
    are ``click.Path``'s, applied to a local path."""
    return LocationType(why=why, dataset_folder=dataset_folder, path_type=Path, **kwargs)


def path_type(*, why: str = "", **kwargs: Any) -> LocationType:
    """A local path (``pathlib.Path``, with ``click.Path``'s checks): a URL is refused, naming the
    option and the URL, and ``why`` (what needs a local path) when given."""
    return LocationType(local_only=True, why=why, path_type=Path, **kwargs)


class PositiveFloat(click.ParamType):
    """A finite number above zero (click's FloatRange lets NaN through: NaN compares false)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not (number > 0 and number < float("inf")):
            self.fail(f"{value!r} is not a finite number above 0", param, ctx)
        return number


POSITIVE_FLOAT = PositiveFloat()


def workers_option(*, minimum: int = 1, help: str = "Packing processes (default: available cores).",
                   short: bool = False) -> Decorator:
    """``--workers N``: at least ``minimum`` (1 for packing/checking processes, 0 for DataLoaders)."""
    names = ("--workers", "-j") if short else ("--workers",)
    return click.option(*names, type=click.IntRange(min=minimum, max=4096), default=None, help=help)


def json_option(help: str = "Print one JSON document on stdout.") -> Decorator:
    """``--json``: exactly one JSON document on stdout (the parameter is ``as_json``)."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def quiet_option() -> Decorator:
    """``--quiet``/``-q``: no progress bar, only warnings and errors."""
    return click.option("--quiet", "-q", is_flag=True, help="No progress bar, only warnings and errors.")


def verbose_option() -> Decorator:
    """``--verbose``/``-v``: also log what each step does (the ``packer.*`` loggers at INFO)."""
    return click.option("--verbose", "-v", is_flag=True, help="Also log what each step does (packer.* loggers at INFO).")


def seed_option(*, default: int | None = 0, help: str = "Seed of the sample-order permutation.") -> Decorator:
    """``--seed N``: 0 to 2^64-1 (a negative seed is a usage error, not a numpy traceback)."""
    return click.option("--seed", type=click.IntRange(0, MAX_SEED), default=default,
                        show_default=default is not None, help=help)


def root_option(help: str = "Folder that manifest paths are relative to (default: the manifest's "
                            "folder).") -> Decorator:
    """``--root DIR``: must be an existing folder."""
    return click.option("--root", type=path_type(exists=True, file_okay=False),
                        default=None, help=help)


def max_pixels_option(*, default: int | None, help: str) -> Decorator:
    """``--max-pixels N``: a positive pixel count (width x height)."""
    return click.option("--max-pixels", type=click.IntRange(min=1, max=_MAX_SIZE), default=default,
                        show_default=default is not None, help=help)


def max_file_size_option(*, default: int) -> Decorator:
    """``--max-file-size SIZE``: files larger than this are rejected (``file-too-large``)."""
    return click.option("--max-file-size", type=SIZE, default=default, show_default=f"{default >> 20}M",
                        help="Reject source files larger than this (e.g. 256M, 2G): one sparse or "
                             "runaway file cannot exhaust a worker's memory.")
