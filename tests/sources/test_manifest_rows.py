"""How manifest rows become samples: one key per file whatever the spelling of its path (issue 31).

The door lists each row under its normalised key; the source contract (``list_source``) packs the
first row of a key and rejects the rest as ``duplicate-entry``."""

from __future__ import annotations

from pathlib import Path

from packer.sources import SourceOptions, list_source
from packer import SourceSettings

from helpers import png_folder


def test_two_spellings_of_one_path_are_one_sample(tmp_path: Path) -> None:
    src = png_folder(tmp_path / "img", 2)
    manifest = tmp_path / "rows.csv"
    manifest.write_text("path,label\ndog/000.png,0\ndog/./000.png,0\ncat//001.png,1\ncat/001.png,1\n")
    listing = list_source(manifest, SourceOptions(source=SourceSettings(root=src)))
    assert [listing.key(i) for i in range(len(listing))] == ["dog/000.png", "cat/001.png"]
    assert sorted((r.key, r.reason) for r in listing.rejected) == [("cat/001.png", "duplicate-entry"),
                                                                  ("dog/000.png", "duplicate-entry")]
