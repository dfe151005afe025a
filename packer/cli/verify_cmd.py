"""``packer verify DATASET``: check every byte; exit 0 when intact, 1 when damaged."""

from __future__ import annotations

from typing import Any

import click

from . import EXIT_DAMAGED, EXIT_OK, cli, configure_logging, echo, emit_json, run_command, terminal_safe
from ..location import Location
from .options import json_option, max_pixels_option, location_type, path_type, quiet_option, verbose_option, workers_option

__all__ = ["verify_command"]


@cli.command("verify")
@click.argument("dataset", type=location_type(exists=True, dataset_folder=True))
@click.option("--decode", is_flag=True, help="Also decode every image (slow: milliseconds per image).")
@max_pixels_option(default=None, help="With --decode: refuse images with more pixels than this (default: "
                   "the limit the dataset was built with).")
@workers_option(help="Processes checking shards in parallel (default: one per core, at most one per shard).")
@json_option("Print the report as one JSON document on stdout.")
@quiet_option()
@verbose_option()
def verify_command(dataset: Location, decode: bool, workers: int | None, as_json: bool, quiet: bool,
                   verbose: bool, max_pixels: int | None) -> None:
    """Check every byte of DATASET; exit 0 only if it is intact.

    Manifest and index structure, every shard header, size and checksum, every sample checksum,
    zero padding, and with --decode every image. Declared
    fields too: image fields' shards like the main ones, text values UTF-8, class sets sorted.
    Names each damaged sample (number, shard, field, key, what is wrong). Exit status 0:
    intact; 1: damaged."""
    from ..verify import verify

    configure_logging(quiet=quiet, verbose=verbose)

    def body() -> int:
        report = verify(dataset, decode=decode, workers=workers, progress=not quiet, max_pixels=max_pixels)
        if as_json:
            emit_json(report.to_json())
        else:
            for problem in report.problems:  # one line each, whatever the key holds
                echo(terminal_safe(str(problem), keep_newlines=False))
            speed = (f"{report.bytes_read / 1e6:.1f} MB in {report.seconds:.2f} s, "
                     f"{report.megabytes_per_second:.0f} MB/s")
            checked = (f"{report.samples_checked} of {report.samples} samples in {report.shards_checked} of "
                       f"{report.shards} shard(s) checked{' and decoded' if decode else ''}"
                       + _fields_checked(report.fields))
            if report.ok:
                echo(f"OK: {checked} ({speed})")
            elif any(p.kind == "structure" for p in report.problems):
                echo("DAMAGED: the manifest or index cannot be trusted, so no shard was checked")
            else:
                echo(f"DAMAGED: {len(report.problems)} problem(s), {report.damaged_sample_count} damaged "
                           f"sample(s); {checked} ({speed})")
        return EXIT_OK if report.ok else EXIT_DAMAGED

    run_command(body, as_json=as_json)


def _fields_checked(fields: dict[str, dict[str, Any]]) -> str:
    """``; fields: boxes, caption, mask (8 images in 3 shards)`` (nothing without fields)."""
    if not fields:
        return ""
    parts = []
    for name, entry in fields.items():
        if entry["kind"] == "image":
            parts.append(f"{name} ({entry['samples_checked']} images in {entry['shards_checked']} of "
                         f"{entry['shards']} shards)")
        else:
            parts.append(name)
    return "; fields " + ", ".join(parts)
