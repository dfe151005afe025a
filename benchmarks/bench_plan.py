"""Plan a build of N synthetic entries (default 10,000,000): time and peak memory of the planner.

    python benchmarks/bench_plan.py [--entries 10000000] [--out /tmp/plan-bench]

The listing is synthesised as flat arrays (keys like ``c0042/000001234.jpg`` in one UTF-8 blob,
sizes drawn around 110 KB), exactly the form ``packer.sources.folder`` produces while walking a folder,
then planned (seeded permutation + greedy shard cut) and saved as the plan file a split build
uses. Prints the seconds of each step, the plan file size, and the peak RSS of the process.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
from pathlib import Path

import harness
import numpy as np

from packer.writer.plan import BuildOptions, make_plan, save_plan
from packer.sources.listing import SourceListing


def synthetic_listing(entries: int, classes: int = 1000, seed: int = 0) -> SourceListing:
    """Fixed-width keys ``cNNNN/NNNNNNNNN.jpg`` built digit by digit with numpy (no Python strings)."""
    rng = np.random.default_rng(seed)
    width = 19
    index = np.arange(entries, dtype=np.int64)
    labels = (index * classes) // max(entries, 1)
    blob = np.empty((entries, width), dtype=np.uint8)
    blob[:, 0] = ord("c")
    for position, power in enumerate(range(3, -1, -1)):
        blob[:, 1 + position] = ord("0") + (labels // 10**power) % 10
    blob[:, 5] = ord("/")
    for position, power in enumerate(range(8, -1, -1)):
        blob[:, 6 + position] = ord("0") + (index // 10**power) % 10
    blob[:, 15:19] = np.frombuffer(b".jpg", dtype=np.uint8)
    sizes = np.clip(rng.normal(110_000, 40_000, entries), 2_000, 2_000_000).astype(np.uint64)
    return SourceListing(
        root=Path("."), kind="folder", classes=tuple(f"c{c:04d}" for c in range(classes)),
        key_blob=blob.reshape(-1), key_offsets=np.arange(entries + 1, dtype=np.uint64) * width,
        sizes=sizes, labels=labels, meta_blob=np.zeros(0, dtype=np.uint8),
        meta_offsets=np.zeros(entries + 1, dtype=np.uint64))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=10_000_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="packer-plan-"))
    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, object] = {}
    synthesise = harness.measure(lambda: made.update(listing=synthetic_listing(args.entries)), items=args.entries)
    planning = harness.measure(lambda: made.update(plan=make_plan(made["listing"], BuildOptions())),
                               items=args.entries)
    plan = made["plan"]
    saving = harness.measure(lambda: save_plan(plan, out / "plan.pkp"), items=args.entries)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size_mib = (out / "plan.pkp").stat().st_size / 2**20
    print(f"entries            {args.entries:,}")
    print(f"synthesise listing {synthesise.seconds:6.2f} s")
    print(f"plan (permute+cut) {planning.seconds:6.2f} s   -> {plan.shard_count:,} shards of <= 512 MiB "  # type: ignore[attr-defined]
          f"({1e9 * planning.cpu_seconds / args.entries:,.0f} CPU ns per entry)")
    print(f"save plan          {saving.seconds:6.2f} s   -> {size_mib:,.0f} MiB plan file")
    print(f"peak RSS           {peak_mib:,.0f} MiB ({peak_mib * 2**20 / args.entries:.0f} bytes per entry)")
    (out / "plan.pkp").unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
