"""Options shared by several commands, defined once with the same types and ranges everywhere.

Every numeric option has a click range type, so a bad value (``--workers 0``, ``--seed -1``,
``--max-pixels 0``) is a usage error (exit 2) that names the option, never a traceback from deep
inside the library. Sizes accept ``512M``, ``1G``, ``64KiB`` or a plain number of bytes.
"""

from __future__ import annotations

from typing import Any, Callable

import click

__all__ = ["SIZE", "SizeType", "PathType", "path_type", "POSITIVE_FLOAT", "PositiveFloat", "MAX_SEED", "workers_option", "json_option", "quiet_option", "verbose_option",
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


class PathType(click.Path):
    """``click.Path`` that also refuses an empty string (``Path("")`` is ``.``, the working folder)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path is not allowed (it would mean the current folder)", param, ctx)
        return super().convert(value, param, ctx)


class LocationType(PathType):
    """A dataset folder or a dataset URL (``s3://``, ``gs://``, ``az://``, ``https://``, ``file://``):
    a URL stays a string (checked by ``packer.remote.parse_url``), a folder is a ``pathlib.Path``."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ..remote.url import is_url, parse_url

        if is_url(value):
            from ..errors import OptionError

            try:
                url = parse_url(value)
            except OptionError as exc:
                self.fail(exc.message, param, ctx)
            if url.scheme == "file":
                return super().convert(url.local_path, param, ctx)
            return url.text
        return super().convert(value, param, ctx)


def location_type(**kwargs: Any) -> LocationType:
    """A ``LocationType`` (a folder as ``pathlib.Path``, or a dataset URL as a string)."""
    from pathlib import Path

    return LocationType(path_type=Path, **kwargs)


def path_type(**kwargs: Any) -> PathType:
    """A ``PathType`` yielding ``pathlib.Path`` (the arguments of ``click.Path``)."""
    from pathlib import Path

    return PathType(path_type=Path, **kwargs)


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
