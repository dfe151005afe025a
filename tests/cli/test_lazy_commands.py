"""Each CLI command imports only its own code when it runs; ``packer --help`` imports none."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from packer.cli import COMMANDS, _register, cli

PROBE = """
import json, sys
from packer.cli import main
sys.argv = ["packer", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("packer.cli.", "packer.writer", "packer.sources",
                                                                   "packer.verify", "packer.export", "torch")))))
"""


def loaded_after(*argv: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_lists_every_command_without_importing_one() -> None:
    loaded = loaded_after("--help")
    assert loaded == [], loaded


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_imports_its_own_module_and_no_other_command(name: str) -> None:
    loaded = loaded_after(name, "--help")
    commands = [m for m in loaded if m.endswith("_cmd")]
    assert commands == [f"packer.cli.{COMMANDS[name][0]}"]
    if name in ("inspect", "verify"):  # reading a dataset needs no writer, no sources, no torch
        assert not [m for m in loaded if m.startswith(("packer.writer", "packer.sources", "torch"))], loaded


def test_the_listed_help_is_each_command_own_first_paragraph() -> None:
    _register()
    assert set(cli.commands) == set(COMMANDS)
    for name, command in cli.commands.items():
        module, short = COMMANDS[name]
        assert command.callback.__module__ == f"packer.cli.{module}"
        assert " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split()) == short, name
        # one sentence that `packer --help` (80 columns) and the site's command list show whole
        assert short.endswith(".") and short.count(". ") == 0 and len(short) <= 80 - 6 - max(map(len, COMMANDS)), short


def test_packer_help_cuts_no_summary() -> None:
    from click.testing import CliRunner

    listed = CliRunner().invoke(cli, ["--help"], terminal_width=80).output.split("Commands:")[1]
    assert "..." not in listed and all(COMMANDS[name][1] in listed for name in COMMANDS), listed
