"""``packer export DATASET OUT --to folder|tar|webdataset``: write the samples back out (``packer.export``)."""

from __future__ import annotations

from pathlib import Path

import click

from . import EXIT_OK, cli, emit_json, run_command
from .options import location_type

__all__ = ["export_command"]


@cli.command("export")
@click.argument("dataset", type=location_type(exists=True))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--to", "target", type=click.Choice(["folder", "tar", "webdataset"]), default="folder",
              show_default=True, help="A folder of class folders, one tar, or WebDataset shards.")
@click.option("--classes", default=None, help="Only these classes (comma-separated names or labels).")
@click.option("--samples", default=None, help="Only samples START:STOP, in dataset order (e.g. 0:1000).")
@click.option("--keys", type=click.Path(exists=True, path_type=Path), default=None,
              help="Only the keys listed in this file, one per line.")
@click.option("--samples-per-shard", default=10_000, show_default=True, type=int,
              help="webdataset: samples per shard.")
@click.option("--overwrite", is_flag=True, help="Write into an existing OUT.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON on stdout.")
def export_command(dataset: Path, out: Path, target: str, classes: str | None, samples: str | None,
                   keys: Path | None, samples_per_shard: int, overwrite: bool, as_json: bool) -> None:
    """Write the samples of DATASET to OUT: the stored bytes verbatim, keys as names, labels as
    class folders (folder, tar) or .cls members (webdataset)."""
    from ..export import export

    def body() -> int:
        result = export(dataset, out, to=target, classes=classes.split(",") if classes else None,
                        samples=samples, keys=keys, samples_per_shard=samples_per_shard, overwrite=overwrite)
        if as_json:
            emit_json({"ok": True, **result.to_json()})
        click.echo(f"exported {result.samples} samples ({result.bytes / 1e6:.1f} MB) into {result.files} "
                   f"file(s) at {out}" + (f"; {result.skipped_unsafe} unsafe key(s) skipped"
                                          if result.skipped_unsafe else ""), err=True)
        return EXIT_OK

    run_command(body, as_json=as_json)
