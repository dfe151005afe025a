"""``packer export DATASET OUT --to folder|tar|webdataset``: write the samples back out (``packer.export``)."""

from __future__ import annotations

from pathlib import Path

import click

from . import EXIT_OK, cli, echo, emit_json, run_command
from .options import location_type, path_type
from ..location import Location

__all__ = ["export_command"]


@cli.command("export")
@click.argument("dataset", type=location_type(exists=True))
@click.argument("out", type=location_type())
@click.option("--to", "target", type=click.Choice(["folder", "tar", "webdataset"]), default="folder",
              show_default=True, help="A folder of class folders, one tar, or WebDataset shards.")
@click.option("--classes", default=None, help="Only these classes (comma-separated names or labels).")
@click.option("--samples", default=None, help="Only samples START:STOP, in dataset order (e.g. 0:1000).")
@click.option("--keys", type=path_type(exists=True), default=None,
              help="Only the keys listed in this file, one per line.")
@click.option("--samples-per-shard", default=10_000, show_default=True, type=int,
              help="webdataset: samples per shard.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing OUT as a whole (never written into; only what an export of this target "
                   "could have written is replaced).")
@click.option("--skip-unsafe", is_flag=True,
              help="Export the samples the target holds safely and skip (count, list) the others, instead of "
                   "refusing the export.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON on stdout.")
def export_command(dataset: Location, out: Location, target: str, classes: str | None, samples: str | None,
                   keys: Path | None, samples_per_shard: int, overwrite: bool, skip_unsafe: bool,
                   as_json: bool) -> None:
    """Write the samples of DATASET back out to OUT, bytes verbatim.

    Keys become names, labels class folders (folder, tar) or .cls members (webdataset).

    Every name is checked before anything is written; a sample the target cannot hold safely
    (unsafe name, collision, a value a build would not read back) refuses the export (exit 2)
    unless --skip-unsafe. DATASET may be a URL; OUT is a local path (an export is not a packer
    dataset, so it is not uploaded: export, then copy it up)."""
    from ..export import export

    def body() -> int:
        result = export(dataset, out, to=target, classes=classes.split(",") if classes else None,
                        samples=samples, keys=keys, samples_per_shard=samples_per_shard, overwrite=overwrite,
                        skip_unsafe=skip_unsafe)
        if as_json:
            emit_json({"ok": True, **result.to_json()})
        click.echo(f"exported {result.samples} samples ({result.bytes / 1e6:.1f} MB) into {result.files} "
                   f"file(s) at {out}", err=True)
        if result.skipped_unsafe:
            counts = ", ".join(f"{count} {reason}" for reason, count in sorted(result.skipped.items()))
            echo(f"skipped {result.skipped_unsafe} sample(s) the target cannot hold safely ({counts}):", err=True)
            for key, reason, message in result.skipped_examples:
                echo(f"  {key}: {reason}: {message}", err=True)
            if result.skipped_unsafe > len(result.skipped_examples):
                echo(f"  ... and {result.skipped_unsafe - len(result.skipped_examples)} more", err=True)
        return EXIT_OK

    run_command(body, as_json=as_json)
