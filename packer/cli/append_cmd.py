"""``packer append DATASET SRC``: add new samples as new shards, atomically."""

from __future__ import annotations

from pathlib import Path

import click

from . import cli, configure_logging, echo, emit_json, run_command
from ..location import Location
from .options import json_option, location_type, path_type, quiet_option, verbose_option, root_option, seed_option, workers_option


@cli.command("append")
@click.argument("dataset", type=location_type(exists=True, file_okay=False))
@click.argument("source", type=path_type(exists=True))
@root_option()
@workers_option()
@seed_option(default=None, help="Order seed (default: the dataset's seed + generation).")
@quiet_option()
@verbose_option()
@json_option("Print the summary as JSON on stdout.")
def append_command(dataset: Location, source: Path, root: Path | None, workers: int | None, seed: int | None,
                   quiet: bool, as_json: bool, verbose: bool) -> None:
    """Append the images of SOURCE to DATASET as new shards.

    SOURCE is a folder or a manifest.

    Existing shards are never rewritten; readers of the previous version are unaffected. New class
    names get new label ids; existing ids never change. `packer inspect` shows the history.
    """
    from ..writer.append import append
    from ..writer.settings import RunOptions

    configure_logging(quiet=quiet, verbose=verbose)

    def body() -> int:
        result = append(dataset, source, root=root, seed=seed, run=RunOptions(workers=workers, progress=not quiet))
        echo(f"dataset now holds {result.sample_count} samples in {result.shard_count} shards; "
                   f"{len(result.rejected)} new file(s) rejected", err=True)
        if as_json:
            emit_json({"ok": True, "samples": result.sample_count, "shards": result.shard_count,
                       "rejected": len(result.rejected)})
        return 0

    run_command(body, as_json=as_json)
