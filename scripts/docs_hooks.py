"""MkDocs hooks of the documentation site (mkdocs.yml names this file under ``hooks:``).

* **Pages from the repository's own files**, so nothing is written twice: the home page is
  ``README.md``, ``reference/spec.md`` is ``formats/SPEC.md`` and ``changelog.md`` is
  ``CHANGELOG.md``. Their links are rewritten for the site: a link to a file the site holds
  (``docs/guides/x.md``, ``formats/SPEC.md``, an image under ``docs/``) points at its page,
  and a link to anything else in the repository (``LICENSE``, a script) becomes its text in
  code style, since the site has no copy of it.
* **The CLI's commands** are registered before mkdocs-click documents ``packer.cli:cli`` (each
  command module adds itself to the group when imported), and the option tables show each
  option's real default: click 8.3 keeps an unset default as its ``Sentinel.UNSET`` object,
  which mkdocs-click 0.9 prints as it is (``show_default``, below).
* **Pages nobody listed**: every ``docs/guides/*.md`` and ``docs/reference/*.md`` that the nav
  does not name is appended to a section (``AUTO_SECTIONS``: a guide to "More guides", made
  before "Reference" when needed; the guides are grouped by task, Build, Train, Integrations,
  Operate), so a new guide shows up without editing mkdocs.yml (list it there to choose its
  place).
"""

from __future__ import annotations

import copy
import importlib
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
#: repository file -> the site page generated from it
GENERATED = {"README.md": "index.md", "formats/SPEC.md": "reference/spec.md", "CHANGELOG.md": "changelog.md"}
#: docs sub-folder -> the nav section its unlisted pages are appended to (made when missing)
AUTO_SECTIONS = {"guides": "More guides", "reference": "Reference"}
#: a section made for unlisted pages goes before this one
BEFORE = "Reference"
LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")


def site_target(repo_path: str) -> str | None:
    """The docs-relative path of a repository file on the site, or None when the site lacks it."""
    if repo_path in GENERATED:
        return GENERATED[repo_path]
    if repo_path.startswith("docs/") and (REPO / repo_path).is_file():
        return repo_path.removeprefix("docs/")
    return None


def rewrite_links(markdown: str, source: str, page: str) -> str:
    """Links of the repository file ``source``, rewritten for the generated page ``page``."""
    source_dir, page_dir = posixpath.dirname(source), posixpath.dirname(page)

    def replace(match: re.Match[str]) -> str:
        bang, label, target = match.groups()
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(source_dir, path))
        found = site_target(repo_path)
        if found is None:
            return label if label.startswith("`") else f"`{label}`"
        relative = posixpath.relpath(found, page_dir or ".")
        return f"{bang}[{label}]({relative}{'#' + anchor if anchor else ''})"

    return LINK.sub(replace, markdown)


def shown_default(option: Any) -> Any:
    """The default an option table shows: click's own reading (``to_info_dict``: ``False`` for a
    flag, ``None`` for a value option left unset), never click 8.3's ``Sentinel.UNSET``."""
    return option.to_info_dict().get("default", option.default)


def _rows_with_real_defaults(format_row: Any) -> Any:
    if getattr(format_row, "shows_real_defaults", False):
        return format_row

    def format_option_row(option: Any) -> str:
        shown = copy.copy(option)
        shown.default = shown_default(option)
        return format_row(shown)

    format_option_row.shows_real_defaults = True  # type: ignore[attr-defined]
    return format_option_row


def on_config(config: Any) -> Any:
    from mkdocs_click import _docs as click_docs

    from packer.cli import COMMAND_MODULES

    for name in COMMAND_MODULES:
        importlib.import_module(f"packer.cli.{name}")
    # mkdocs-click 0.9 formats a table row from option.default (its pull request 95 reads
    # to_info_dict instead); until a release does, the rows read a copy with the real default.
    click_docs._format_table_option_row = _rows_with_real_defaults(click_docs._format_table_option_row)
    docs = Path(config["docs_dir"])
    listed: set[str] = set()

    def walk(items: Any) -> None:
        for item in items or []:
            if isinstance(item, str):
                listed.add(item)
            elif isinstance(item, dict):
                for value in item.values():
                    walk(value if isinstance(value, list) else [value])

    walk(config["nav"])
    nav = config["nav"]
    for folder, title in AUTO_SECTIONS.items():
        missing = [f"{folder}/{path.name}" for path in sorted((docs / folder).glob("*.md"))
                   if f"{folder}/{path.name}" not in listed]
        if not missing:
            continue
        section = next((entry for entry in nav if isinstance(entry, dict) and title in entry), None)
        if section is None:
            at = next((k for k, entry in enumerate(nav) if isinstance(entry, dict) and BEFORE in entry), len(nav))
            section = {title: []}
            nav.insert(at, section)
        section[title].extend(missing)
    return config


def on_files(files: Files, config: Any) -> Files:
    for source, page in GENERATED.items():
        text = (REPO / source).read_text("utf-8")
        files.append(File.generated(config, page, content=rewrite_links(text, source, page)))
    return files
