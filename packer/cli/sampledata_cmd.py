"""``packer sample-data OUT``: real photographs in the folders the guides name (``packer.sampledata``)."""

from __future__ import annotations

from pathlib import Path

import click

from . import cli, echo, emit_json, run_command
from .options import json_option, path_type

__all__ = ["sample_data_command"]


@cli.command("sample-data")
@click.argument("out", type=path_type(why="sample data is written to a local folder", file_okay=False))
@click.option("--per-class", default=16, show_default=True, type=click.IntRange(min=2),
              help="Training images per class.")
@json_option("Print what was written as JSON on stdout.")
def sample_data_command(out: Path, per_class: int, as_json: bool) -> None:
    """Write real sample photographs in class folders to OUT.

    Crops of five public-domain and CC0 photographs (their licences are in OUT/PHOTOS.md):
    imagenet/train and imagenet/val (class folders of JPEGs; val lacks a class), cifar/train
    (32x32 PNGs), more/ (new samples and a new class, for append), list.csv and list.jsonl
    (manifests of imagenet/train) and coco/ (a COCO detection file). The guides read them from
    ~/data: run `packer sample-data ~/data` to follow any page. Nothing is written over.
    """
    from ..sampledata import write_sample_data

    def body() -> int:
        written = write_sample_data(out, per_class=per_class)
        counts = ", ".join(f"{folder} {count}" for folder, count in written.counts.items())
        echo(f"wrote sample data to {out}: {counts} images; manifests list.csv, list.jsonl; licences in "
             f"{out / 'PHOTOS.md'}", err=True)
        if as_json:
            emit_json({"ok": True, **written.to_json()})
        return 0

    run_command(body, as_json=as_json)
