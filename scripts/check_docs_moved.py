"""Check that nothing of the old README was lost when it moved into the documentation site.

    python scripts/check_docs_moved.py [--from 6caf3ca] [--show-edited]

Splits the README at commit ``--from`` (the 1,443-line one) into units: each paragraph, each
list item and each code block, and looks for every unit in the current ``README.md`` and
``docs/**/*.md``, whitespace and line wrapping ignored (and the install hints' old distribution
name read as the new one). A unit not found word for word is matched against every unit of the
docs: ``edited`` when the closest one is at least ``--threshold`` alike (paths fixed, a sentence
reworded: ``covered``), ``missing`` otherwise. Section titles that changed are listed apart. Prints the counts, then each missing unit (and, with
``--show-edited``, each edited one beside its closest match); exits 1 when anything is missing.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def units(markdown: str) -> list[str]:
    """Paragraphs, list items and fenced code blocks of a Markdown text, in order."""
    found: list[str] = []
    current: list[str] = []
    lines = markdown.splitlines()
    i = 0

    def flush() -> None:
        if current:
            found.append("\n".join(current))
            current.clear()

    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            flush()
            end = i + 1
            while end < len(lines) and not lines[end].lstrip().startswith("```"):
                end += 1
            found.append("\n".join(lines[i:end + 1]))
            i = end + 1
            continue
        if not line.strip() or line.startswith("<!--"):
            flush()
        elif re.match(r"^(- |\d+\. |#+ |\|)", line):
            flush()
            current.append(line)
            if line.startswith(("#", "|")):
                flush()
        else:
            current.append(line)
        i += 1
    flush()
    return [unit for unit in found if normalise(unit)]


def normalise(text: str) -> str:
    text = re.sub(r"(?<![\w-])packer\[(\w+)\]", r"packer-shards[\1]", text)  # the old distribution name
    text = re.sub(r"^\s*(#+|-|\d+\.)\s+", "", text)          # heading marks, list bullets
    text = re.sub(r"```[a-z]*", "```", text)
    return " ".join(text.replace(":**", "**").split()).rstrip(":")


def covered(old: str, new: str) -> float:
    """The share of ``old``'s characters found, in order, in ``new`` (text added around them is free)."""
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / max(len(old), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="rev", default="6caf3ca", help="the commit holding the old README")
    parser.add_argument("--threshold", type=float, default=0.75)
    parser.add_argument("--show-edited", action="store_true")
    args = parser.parse_args(argv)
    old = subprocess.run(["git", "show", f"{args.rev}:README.md"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    new_units = [normalise(u) for page in pages for u in units(page.read_text("utf-8"))]
    corpus = "\n".join(new_units)
    # a paragraph split in two (or merged) is matched against neighbouring units joined
    candidates = new_units + [f"{a} {b}" for a, b in zip(new_units, new_units[1:])]
    verbatim, edited, missing, headings = [], [], [], []
    for unit in units(old):
        text = normalise(unit)
        if text in corpus:
            verbatim.append(text)
            continue
        if unit.startswith("#"):  # a section title: renamed or merged with the page's structure
            headings.append(text)
            continue
        ranked = sorted(candidates, key=lambda other: difflib.SequenceMatcher(None, text, other, autojunk=False)
                        .quick_ratio(), reverse=True)[:20]
        ratio, best = max((covered(text, other), other) for other in ranked)
        (edited if ratio >= args.threshold else missing).append((ratio, text, best))
    total = len(verbatim) + len(edited) + len(missing) + len(headings)
    print(f"old README at {args.rev}: {total} units (paragraphs, list items, code blocks, headings); in "
          f"README.md + docs/: {len(verbatim)} word for word, {len(edited)} edited (>= {args.threshold:.0%} of "
          f"the old text kept, in order), {len(missing)} missing; {len(headings)} section titles renamed: "
          + "; ".join(headings))
    if args.show_edited:
        for ratio, text, best in edited:
            print(f"\nEDITED ({ratio:.0%}):\n  old: {text[:300]}\n  new: {best[:300]}")
    for ratio, text, best in missing:
        print(f"\nMISSING (closest {ratio:.0%}):\n  old: {text[:400]}\n  closest: {best[:200]}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
