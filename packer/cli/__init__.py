"""The ``packer`` command line: a thin click shell over the library, one module per command.

Exit codes (one place maps errors to them): 0 ok, 1 verify found damage / a format error,
2 usage or bad input, 3 I/O or environment. With ``--json`` stdout holds exactly one JSON
document (sorted keys, with the format version); without it, a command's report (inspect,
verify) goes to stdout so it can be piped. Progress bars, warnings and errors always go to stderr.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, Callable

import click

from .. import __version__
from ..errors import PackerError
from ..format import FORMAT_VERSION

__all__ = ["main", "cli", "emit_json", "run_command", "configure_logging"]

EXIT_OK, EXIT_DAMAGED, EXIT_USAGE, EXIT_IO = 0, 1, 2, 3


def emit_json(document: dict[str, Any]) -> None:
    """Print the one JSON document of a ``--json`` run to stdout."""
    document = {"format_version": FORMAT_VERSION, "packer_version": __version__, **document}
    click.echo(json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False))


def configure_logging(*, quiet: bool = False, verbose: bool = False) -> None:
    """Route the ``packer`` loggers to stderr for a CLI run: warnings always, INFO with ``--verbose``.

    The library itself only logs (it configures nothing, like any library); the CLI decides.
    ``--quiet`` keeps warnings and errors: they are what a user must not miss. ``run_command``
    undoes this when the command ends, so an in-process caller (a test, a notebook using
    ``CliRunner``) keeps its own logging set-up.
    """
    logger = logging.getLogger("packer")
    _reset_logging()
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose and not quiet else logging.WARNING)


def _reset_logging() -> None:
    logger = logging.getLogger("packer")
    for handler in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(handler)
        logger.setLevel(handler.previous_level)


class _StderrHandler(logging.Handler):
    """Writes to the *current* ``sys.stderr`` (a test runner may swap it between commands)."""

    previous_level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:  # noqa: BLE001 - logging must never break the command
            self.handleError(record)


def run_command(body: Callable[[], int | None], *, as_json: bool = False) -> None:
    """Run a command body and turn PackerError into its exit code and a one-line message."""
    try:
        code = body() or EXIT_OK
    except PackerError as exc:
        if as_json:
            emit_json({"ok": False, "error": type(exc).__name__, "message": str(exc)})
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    finally:
        _reset_logging()
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="packer")
def cli() -> None:
    """Pack image datasets into large aligned shards, inspect and verify them."""


COMMAND_MODULES = ("build_cmd", "inspect_cmd", "verify_cmd", "append_cmd", "bench_cmd")


def _register() -> None:
    """Import the command modules; each adds its command to ``cli``."""
    for name in COMMAND_MODULES:
        try:
            __import__(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise


def main(argv: list[str] | None = None) -> None:
    _register()
    cli.main(args=argv, prog_name="packer")
