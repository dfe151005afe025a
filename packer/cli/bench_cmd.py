"""``packer bench DATASET``: time the loader as configured and compare it with the model's rate."""

from __future__ import annotations

import click

from . import cli, echo, emit_json, run_command
from .options import POSITIVE_FLOAT, json_option, location_type, path_type, seed_option, workers_option
from ..bench import DECODE_MODES, HEADROOM, LOADERS, READERS, BenchOptions
from ..location import Location
from ..order import ORDERS


@cli.command("bench")
@click.argument("dataset", type=location_type())
@click.option("--batch-size", "-b", default=256, show_default=True, type=click.IntRange(min=1))
@workers_option(minimum=0, short=True,
                help="DataLoader worker processes, or ThreadedLoader's threads with --loader threaded "
                     "(default: the cores this process may use).")
@click.option("--order", type=click.Choice(ORDERS), default="random", show_default=True,
              help="Read order: sequential, random, or block shuffle.")
@click.option("--decode", type=click.Choice(DECODE_MODES), default="rrc", show_default=True,
              help="none: bytes only; full: decode full images; rrc: fused random-resized-crop + "
                   "flip; center: fused resize + centre crop.")
@click.option("--size", default=None, type=click.IntRange(min=1),
              help="Output size of the rrc and center transforms (default: 224, or the stored size for raw "
                   "datasets and images smaller than 224 px: no upsampling).")
@click.option("--layout", type=click.Choice(["HWC", "CHW"]), default="HWC", show_default=True)
@click.option("--backend", type=click.Choice(["mmap", "pread", "direct"]), default="mmap",
              show_default=True)
@click.option("--reader", type=click.Choice(READERS), default="map", show_default=True,
              help="map: PackedDataset + PackedBatchSampler; iterable: PackedIterableDataset.")
@click.option("--loader", type=click.Choice(LOADERS), default="auto", show_default=True,
              help="torch: a DataLoader with worker processes; threaded: packer.threaded.ThreadedLoader "
                   "(threads in this process, no hand-off); simple: a plain in-process loop; auto: torch "
                   "when it is installed, else simple.")
@click.option("--batches", "-n", default=50, show_default=True, type=click.IntRange(min=1),
              help="Batches timed after the warm-up.")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=0),
              help="Batches read and discarded first.")
@click.option("--pin-memory", is_flag=True, help="Pin batches in the main process, as for GPU training.")
@seed_option(help="Seed of the read order.")
@click.option("--target-rate", type=POSITIVE_FLOAT, default=None,
              help=f"Samples/s the model consumes; the loader should deliver {HEADROOM}x that.")
@json_option("Print the result as one JSON document.")
def bench_command(dataset: Location, batch_size: int, workers: int | None, order: str, decode: str,
                  size: int | None, layout: str, backend: str, reader: str, loader: str, batches: int,
                  warmup: int, pin_memory: bool, seed: int, target_rate: float | None,
                  as_json: bool) -> None:
    """Measure the loader over DATASET and say what limits it.

    Samples/s, MB/s and the CPU of every process.

    Says what limited the run (oversubscribed, contended, cpu-bound, main-bound, read-bound). With
    --target-rate, says whether the loader keeps up with the model (with headroom) and, if not,
    what to change.
    """
    from ..bench import format_report, run_bench

    options = BenchOptions(batch_size=batch_size, workers=workers, order=order, decode=decode,
                           size=size, layout=layout, backend=backend, reader=reader,
                           loader=loader, batches=batches, warmup=warmup, pin_memory=pin_memory,
                           seed=seed, target_rate=target_rate)

    def body() -> int:
        result = run_bench(dataset, options, log=lambda message: echo(message, err=True))
        echo(format_report(result), err=True)
        if as_json:
            emit_json({"ok": True, "bench": result.to_dict()})
        return 0

    run_command(body, as_json=as_json)
