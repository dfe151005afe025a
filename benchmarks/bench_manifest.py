"""Time ``format.parse_manifest`` on a huge manifest against ``json.loads`` of the same bytes.

    python benchmarks/bench_manifest.py [--shards 380000] [--repeat 3]

``json.loads`` is the floor (every reader must parse the JSON); the ratios say what validation
adds on top: for a valid manifest (every shard entry checked), and for two crafted ones that
must be refused cheaply (more shards than samples; shard counts that do not add up to
``sample_count``), which are checked before any entry is. The two run in ``--repeat``
interleaved rounds (``harness.interleave``); the table gives the median round and its ratio.
"""

from __future__ import annotations

import argparse
import json
import sys

import harness

from packer import format as fmt
from packer.errors import ManifestError


def manifest_bytes(shards: int, sample_count: int) -> bytes:
    entries = [{"path": f"shards/shard-{i:05d}-{i:016x}.pks", "size": 4096, "sample_count": 1,
                "checksum": f"{i:016x}"} for i in range(shards)]
    return json.dumps({"format": "packer-dataset", "format_version": 1, "checksum_algorithm": "xxh3_64",
                       "alignment": 4096, "sample_count": sample_count, "codec": {"name": "passthrough"},
                       "classes": [], "index": {"path": "index-0000000000000000.pki", "size": 10,
                                                "checksum": "0" * 16},
                       "shards": entries}, indent=2).encode()


def parse(data: bytes) -> None:
    try:
        fmt.parse_manifest(data)
    except ManifestError:
        pass  # the crafted manifests must be refused: the time to refuse is what is measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=380_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    cases = {"valid": manifest_bytes(args.shards, args.shards),
             "more shards than samples": manifest_bytes(args.shards, 10),
             "counts do not add up": manifest_bytes(args.shards, 10**9)}
    print(f"{args.shards} shards, {len(cases['valid']) / 2**20:.1f} MiB manifest; {args.repeat} rounds")
    for label, data in cases.items():
        results = harness.interleave([("json.loads", lambda: harness.measure(lambda: json.loads(data), items=1)),
                                      ("parse_manifest", lambda: harness.measure(lambda: parse(data), items=1))],
                                     args.repeat, log=None)
        print(f"\n{label}:")
        print(harness.table(harness.summarize(results), unit="manifests", name_width=20,
                            columns=[("median s", lambda row: f"{1 / row.rate:.3f}")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
