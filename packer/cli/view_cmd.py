"""``packer view DATASET OUT``: write a view, a subset of DATASET by selectors, as a small file (``packer.views``)."""

from __future__ import annotations

from pathlib import Path

import click

from . import EXIT_OK, cli, echo, emit_json, run_command
from .options import json_option, location_type, path_type, seed_option
from ..location import Location

__all__ = ["view_command"]


@cli.command("view")
@click.argument("dataset", type=location_type(exists=True, dataset_folder=True))
@click.argument("out", type=path_type(why="a view file is written to a local path"))
@click.option("--classes", default=None, help="Only these classes (comma-separated names or labels).")
@click.option("--keys", type=path_type(exists=True, why="the keys file is read from a local file"), default=None,
              help="Only the keys listed in this file, one per line.")
@click.option("--where", "where", multiple=True,
              help="Only samples where 'FIELD OP VALUE' holds (label, class, key, width, height, channels, size, "
                   "format or a scalar field; OP one of == != < <= > >=). Repeat to require several.")
@click.option("--split", default=None,
              help="Split into parts by a stable hash of each key, e.g. 0.9:0.1: part K is written to OUT with "
                   "-K before .pkview (OUT-0.pkview, OUT-1.pkview); a sample never moves part on append.")
@seed_option(default=0, help="Seed of --split's key hash (same seed, same parts).")
@click.option("--exclude-duplicates-of", "exclude_duplicates_of", type=location_type(exists=True), default=None,
              help="Leave out samples with an exact or near copy in this dataset or view (packer.find_duplicates).")
@click.option("--overwrite", is_flag=True, help="Replace existing view files.")
@json_option("Print what was written as one JSON document on stdout.")
def view_command(dataset: Location, out: Path, classes: str | None, keys: Path | None, where: tuple[str, ...],
                 split: str | None, seed: int, exclude_duplicates_of: Location | None, overwrite: bool,
                 as_json: bool) -> None:
    """Write a view (a subset of DATASET) to the file OUT.

    A view copies no sample: it records the dataset, the selected sample numbers and a
    checksum, and every reader, `packer inspect`, `verify` and `export` open it as a dataset.
    Selectors combine: a sample is kept when each one keeps it. DATASET may be a URL or a view;
    OUT is a local file."""
    from ..dataset import open_dataset
    from ..views import view

    def body() -> int:
        written = view(dataset, out, classes=classes, keys=keys, where=list(where), split=split, seed=seed,
                       exclude_duplicates_of=exclude_duplicates_of, overwrite=overwrite)
        views = []
        for path in written:
            with open_dataset(path) as opened:
                views.append({"path": str(path), "samples": len(opened), "of": opened.view.base_samples})
        if as_json:
            emit_json({"ok": True, "views": views})
        for entry in views:
            empty = " (warning: the selection is empty: a reader of this view reads nothing)" if not entry["samples"] else ""
            echo(f"wrote {entry['path']}: {entry['samples']} of {entry['of']} samples{empty}", err=True)
        return EXIT_OK

    run_command(body, as_json=as_json)
