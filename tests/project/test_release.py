"""What a user installs: the distribution's name, its commands, licence, version and changelog.

The distribution is ``packer-shards`` (the name ``packer`` on the package index is an unrelated
2013 project, so ``pip install 'packer[torch]'`` installed the wrong thing): every install hint in
the repository must name it, and the old form is refused wherever it appears.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import packer

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))
DISTRIBUTION = "packer-shards"
#: ``pip install packer``, ``pip install 'packer[torch]'``, ``pip install "packer[gpu]"``: the old
#: distribution's name, as a whole word (``packer-shards`` and ``-e .`` do not match).
OLD_INSTALL = re.compile(r"pip install\s+(-\S+\s+)*['\"]?packer(\[|['\"\s]|$)", re.MULTILINE)
#: ``packer[zstd]``-style extras named outside a pip command ("with packer[zstd]").
OLD_EXTRA = re.compile(r"(?<![\w-])packer(\\{0,2})\[[a-z][a-z,]*\1\]")  # also a regex's packer\\[torch\\]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".c", ".sh", ".html", ""}


def repository_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files (what a commit would hold)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an sdist): nothing to grep")
    return [REPO / name for name in listed.decode("utf-8").split("\0") if name]


def test_old_install_pattern_matches_what_it_should() -> None:
    assert OLD_INSTALL.search("pip install 'packer[torch]'") and OLD_INSTALL.search("pip install packer\n")
    assert OLD_INSTALL.search('run pip install "packer[gpu]" first') and OLD_INSTALL.search("pip install -U packer")
    assert not OLD_INSTALL.search("pip install 'packer-shards[torch]'")
    assert not OLD_INSTALL.search("pip install packer-shards") and not OLD_INSTALL.search("pip install -e .")
    assert OLD_EXTRA.search("a .tar.zst (with packer[zstd])") and OLD_EXTRA.search("packer[remote,torch]")
    assert not OLD_EXTRA.search("packer-shards[zstd]") and not OLD_EXTRA.search("packer[0]")
    assert OLD_EXTRA.search(r'match=r"packer\[gpu\]"') and OLD_EXTRA.search('match="packer\\\\[torch\\\\]"')
    assert not OLD_EXTRA.search(r'match=r"packer-shards\[gpu\]"')


def test_no_install_hint_names_the_old_distribution() -> None:
    this = Path(__file__).resolve()
    found = []
    for path in repository_files():
        if path.resolve() == this or path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        try:
            content = path.read_text("utf-8")
        except UnicodeDecodeError:
            continue
        for pattern in (OLD_INSTALL, OLD_EXTRA):
            for match in pattern.finditer(content):
                line = content.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(REPO)}:{line}: {match.group(0).strip()}")
    assert not found, f"install hints must name {DISTRIBUTION}, e.g. pip install '{DISTRIBUTION}[torch]':\n" + \
        "\n".join(found)


def test_distribution_name_commands_and_version_source() -> None:
    project = PYPROJECT["project"]
    assert project["name"] == DISTRIBUTION
    assert "version" not in project and project["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "packer._version.__version__"}
    assert project["scripts"] == {"packer": "packer.__main__:entry", "packer-shards": "packer.__main__:entry"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", packer.__version__)


def test_licence_metadata_and_typed_marker() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    licence = (REPO / "LICENSE").read_text("utf-8")
    assert licence.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in licence
    assert (REPO / "packer" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["packer"]


def test_changelog_keeps_a_changelog_with_the_current_version() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text("utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.MULTILINE)
    assert headings[0] == "Unreleased" and packer.__version__ in headings
    assert "keepachangelog.com" in changelog


def test_python_m_packer_runs_the_cli() -> None:
    done = subprocess.run([sys.executable, "-m", "packer", "--version"], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"packer, version {packer.__version__}"


def test_each_store_has_a_narrow_extra_and_remote_is_all_of_them() -> None:
    """An S3-only user installs [s3] (pip never resolves the GCS and Azure SDKs); [remote] is every
    store, and a missing transport names its URL's extra (packer/remote/store.py)."""
    from packer.remote.store import SCHEME_EXTRAS

    extras = PYPROJECT["project"]["optional-dependencies"]
    names = {extra: {re.split(r"[\[<>=]", requirement)[0] for requirement in extras[extra]}
             for extra in ("s3", "gcs", "azure", "http")}
    assert names == {"s3": {"fsspec", "s3fs", "obstore"}, "gcs": {"fsspec", "gcsfs", "obstore"},
                     "azure": {"fsspec", "adlfs", "obstore"}, "http": {"fsspec", "obstore"}}
    assert extras["remote"] == [f"{DISTRIBUTION}[s3,gcs,azure,http]"]
    assert set(SCHEME_EXTRAS.values()) == set(names)
