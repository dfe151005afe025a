"""The ``packer`` command line: a thin click shell over the library, one module per command.

Exit codes (one place maps errors to them): 0 ok, 1 verify found damage / a format error,
2 usage or bad input, 3 I/O or environment. With ``--json`` stdout holds exactly one JSON
document (sorted keys, with the format version); without it, a command's report (inspect,
verify) goes to stdout so it can be piped. Progress bars, warnings and errors always go to stderr.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any, Callable

import click

from .._version import __version__
from ..errors import PackerError

__all__ = ["main", "cli", "emit_json", "run_command", "configure_logging", "echo", "terminal_safe"]

EXIT_OK, EXIT_DAMAGED, EXIT_USAGE, EXIT_IO = 0, 1, 2, 3
#: Exit status after Ctrl-C (128 + SIGINT, what shells report), with one line on stderr.
EXIT_INTERRUPTED = 130


# C0 controls but tab and newline, DEL, C1 controls (0x9B is a CSI on many terminals) and the
# bidirectional overrides: a file name holding them could rewrite or hide what a terminal shows.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str, *, keep_newlines: bool = True) -> str:
    """``text`` with control and bidi-override characters escaped (``\\x1b``, ``\\u202e``).

    Names (file names, class names, keys) come from the source and reach a terminal through
    ``inspect``, ``verify`` and error messages; escaping them keeps an ``ESC [ ...`` sequence in a
    file name from acting on the terminal. Newlines and tabs of a multi-line report are kept;
    pass ``keep_newlines=False`` for one value (a name holding a newline must not forge a line).
    """
    pattern = _UNSAFE if keep_newlines else _UNSAFE_ONE_LINE
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                       else f"\\u{ord(m.group()):04x}", text)


def echo(message: str = "", *, err: bool = False) -> None:
    """``click.echo`` of human text, with ``terminal_safe`` applied (every CLI line goes here)."""
    click.echo(terminal_safe(str(message)), err=err)


def emit_json(document: dict[str, Any]) -> None:
    """Print the one JSON document of a ``--json`` run to stdout."""
    from ..format import FORMAT_VERSION, json_ready  # lazy: numpy is not needed to parse argv

    document = {"format_version": FORMAT_VERSION, "packer_version": __version__, **document}
    # Strict JSON whatever a dataset holds: NaN/Infinity (from an edited manifest or old metadata)
    # become null, so any strict parser reads stdout.
    text = json.dumps(json_ready(document), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    # json escapes C0 controls itself; DEL, C1 and bidi overrides are escaped too (still valid JSON).
    click.echo(_UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


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


def run_command(body: Callable[[], int | None], *, as_json: bool = False, interrupted: str = "interrupted") -> None:
    """Run a command body and turn PackerError into its exit code and a one-line message.

    Args:
        interrupted: the one line printed on Ctrl-C (a command that can continue says how).
    """
    try:
        code = body() or EXIT_OK
    except PackerError as exc:
        if as_json:
            emit_json({"ok": False, "error": type(exc).__name__, "message": str(exc)})
        echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo(interrupted, err=True)
        sys.exit(EXIT_INTERRUPTED)
    except OSError as exc:  # an environment failure outside the library's own checks (EPIPE, EIO)
        if as_json:
            emit_json({"ok": False, "error": type(exc).__name__, "message": str(exc)})
        echo(f"error: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_IO)
    finally:
        _reset_logging()
    sys.exit(code)


#: Each command: its module (imported when the command runs or its own help is asked for) and
#: the first paragraph of its help, for ``packer --help`` (a test keeps the two in step).
COMMANDS: dict[str, tuple[str, str]] = {
    "append": ("append_cmd", "Append the images of SOURCE to DATASET as new shards."),
    "bench": ("bench_cmd", "Measure the loader over DATASET and say what limits it."),
    "build": ("build_cmd", "Pack SOURCE into the dataset folder OUT."),
    "export": ("export_cmd", "Write the samples of DATASET back out to OUT, bytes verbatim."),
    "inspect": ("inspect_cmd", "Summarise DATASET: samples, classes, sizes, rejected files."),
    "sample-data": ("sampledata_cmd", "Write real sample photographs in class folders to OUT."),
    "verify": ("verify_cmd", "Check every byte of DATASET; exit 0 only if it is intact."),
    "view": ("view_cmd", "Write a view (a subset of DATASET) to the file OUT."),
}
COMMAND_MODULES = tuple(module for module, _ in COMMANDS.values())


class _LazyGroup(click.Group):
    """A group that imports a command's module only when that command is looked up (to run it or
    show its help): ``packer inspect`` loads no writer, ``packer --help`` no command at all."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            _load(COMMANDS[cmd_name][0])
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            command = self.commands.get(name)
            if command is not None and command.hidden:
                continue
            # each listed summary is one sentence that fits (tests/cli/test_lazy_commands.py)
            text = command.get_short_help_str(limit) if command is not None else COMMANDS[name][1]
            rows.append((name, text))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="packer")
def cli() -> None:
    """Pack image datasets into large aligned shards, inspect and verify them."""


def _load(module: str) -> None:
    """Import one command module; it adds its command to ``cli``."""
    try:
        __import__(f"{__name__}.{module}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{module}":
            raise


def _register() -> None:
    """Import every command module (``cli`` imports each one lazily otherwise; tests and tools
    that walk ``cli.commands`` call this first)."""
    for module in COMMAND_MODULES:
        _load(module)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: usage errors exit 2, Ctrl-C at any point prints one line and exits 130."""
    try:
        # Not standalone: click would turn Ctrl-C into "Aborted!" with exit 1.
        result = cli.main(args=argv, prog_name="packer", standalone_mode=False)
    except (KeyboardInterrupt, click.Abort):
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        if "--json" in (sys.argv[1:] if argv is None else argv):  # one JSON document, even now
            emit_json({"ok": False, "error": type(exc).__name__, "message": exc.format_message()})
        exc.show()
        sys.exit(exc.exit_code)
    sys.exit(result if isinstance(result, int) else EXIT_OK)
