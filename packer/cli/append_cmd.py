"""``packer append DATASET SRC``: add new samples as new shards, atomically."""

from __future__ import annotations

from pathlib import Path

import click

from . import cli, configure_logging, emit_json, run_command


@cli.command("append")
@click.argument("dataset", type=click.Path(path_type=Path))
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--root", type=click.Path(path_type=Path), help="Folder that manifest paths are relative to.")
@click.option("--workers", type=int, default=None, help="Packing processes (default: available cores).")
@click.option("--seed", type=int, default=None, help="Order seed (default: the dataset's seed + generation).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, only warnings and errors.")
@click.option("--verbose", "-v", is_flag=True, help="Also log what each step does (packer.* loggers at INFO).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def append_command(dataset: Path, source: Path, root: Path | None, workers: int | None, seed: int | None,
                   quiet: bool, as_json: bool, verbose: bool) -> None:
    """Append the images of SOURCE (folder or manifest) to DATASET as new shards.

    Existing shards are never rewritten; readers of the previous version are unaffected. New class
    names get new label ids; existing ids never change. `packer inspect` shows the history.
    """
    from ..build.append import append

    configure_logging(quiet=quiet, verbose=verbose)

    def body() -> int:
        result = append(dataset, source, root=root, workers=workers, seed=seed, progress=not quiet)
        click.echo(f"dataset now holds {result.sample_count} samples in {result.shard_count} shards; "
                   f"{len(result.rejected)} new file(s) rejected", err=True)
        if as_json:
            emit_json({"ok": True, "samples": result.sample_count, "shards": result.shard_count,
                       "rejected": len(result.rejected)})
        return 0

    run_command(body, as_json=as_json)
