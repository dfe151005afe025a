"""Time ``format.parse_manifest`` on a huge manifest against ``json.loads`` of the same bytes.

    python scripts/bench_manifest.py [--shards 380000] [--repeat 3]

``json.loads`` is the floor (every reader must parse the JSON); the ratios say what validation
adds on top: for a valid manifest (every shard entry checked), and for two crafted ones that
must be refused cheaply (more shards than samples; shard counts that do not add up to
``sample_count``), which are checked before any entry is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer import format as fmt  # noqa: E402
from packer.errors import ManifestError  # noqa: E402


def manifest_bytes(shards: int, sample_count: int) -> bytes:
    entries = [{"path": f"shards/shard-{i:05d}-{i:016x}.pks", "size": 4096, "sample_count": 1,
                "checksum": f"{i:016x}"} for i in range(shards)]
    return json.dumps({"format": "packer-dataset", "format_version": 1, "checksum_algorithm": "xxh3_64",
                       "alignment": 4096, "sample_count": sample_count, "codec": {"name": "passthrough"},
                       "classes": [], "index": {"path": "index-0000000000000000.pki", "size": 10,
                                                "checksum": "0" * 16},
                       "shards": entries}, indent=2).encode()


def best(seconds: list[float]) -> float:
    return min(seconds)


def timed(function, repeat: int) -> float:  # type: ignore[no-untyped-def]
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            function()
        except ManifestError:
            pass
        runs.append(time.perf_counter() - started)
    return best(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=380_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    cases = {"valid": manifest_bytes(args.shards, args.shards),
             "more shards than samples": manifest_bytes(args.shards, 10),
             "counts do not add up": manifest_bytes(args.shards, 10**9)}
    print(f"{args.shards} shards, {len(cases['valid']) / 2**20:.1f} MiB manifest; best of {args.repeat}")
    for label, data in cases.items():
        floor = timed(lambda: json.loads(data), args.repeat)
        parse = timed(lambda: fmt.parse_manifest(data), args.repeat)
        print(f"{label:26s} json.loads {floor:6.2f} s   parse_manifest {parse:6.2f} s   ratio {parse / floor:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
