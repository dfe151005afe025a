"""Benchmark: one epoch of a dataset in object storage (a loopback S3 server made to behave remote).

moto's S3 server runs on 127.0.0.1 behind ``scripts/loopback_s3.py``'s proxy, which adds a
latency to every request and caps the bandwidth of all responses together. Measured in one run,
sample bytes read in the block order, batches of 256 (decoding left out: this is the I/O path):

- the store's bandwidth floor: one large GET per shard of the same bytes, one after another;
- cold epoch (empty node cache) through each transport (fsspec+s3fs, obstore);
- warm epoch (the cache holds everything), and the same epoch from the local folder;
- first-batch latency (open included; the epoch rates leave the open out) and GET requests per
  epoch (from the proxy's log).

Usage: ``python benchmarks/bench_remote.py [--samples 3000] [--latency-ms 20] [--bandwidth-mb 200]``.
Each run is timed by ``harness.measure`` (wall and CPU seconds of this process and its children,
which include the loopback server and its proxy: CPU per image is the reader's plus the store's);
ratios are against the floor of the same run. The machine is shared: compare the ratios of one
run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import harness
import numpy as np

SCRIPTS = harness.REPO / "scripts"
sys.path.insert(0, str(harness.REPO / "tests"))


def _control(proxy: str, path: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(proxy + path, data=data), timeout=30) as response:
        return json.loads(response.read())


def _epoch(dataset, order: np.ndarray, batch: int) -> tuple[float, harness.Stretch]:
    """(seconds to the first batch, the epoch's stretch: samples, wall and CPU seconds, bytes)."""
    started = time.perf_counter()
    first: list[float] = []

    def body() -> dict:
        dataset.plan_reads(order)
        nbytes = 0
        for k in range(0, len(order), batch):
            dataset.reads_advanced(k)
            part = dataset.read_batch(order[k:k + batch])
            nbytes += int(part.sizes.sum())
            if not first:
                first.append(time.perf_counter() - started)
        return {"items": len(order), "bytes": nbytes}

    stretch = harness.measure(body)
    return (first[0] if first else 0.0), stretch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--bandwidth-mb", type=float, default=200.0)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    args = parser.parse_args()

    import boto3

    import packer
    from helpers import write_images
    from packer.order import epoch_order, index_blocks
    from packer.remote import RemoteOptions, parse_url
    from packer.remote.upload import upload_dataset
    from packer.writer import BuildOptions, build

    work = Path(args.out or tempfile.mkdtemp(prefix="bench-remote-"))
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ[name] = "bench"
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    server = subprocess.Popen([sys.executable, str(SCRIPTS / "loopback_s3.py")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        endpoints = json.loads(server.stdout.readline())  # type: ignore[union-attr]
        proxy = endpoints["proxy"]
        assert proxy.startswith("http://127.0.0.1:")
        boto3.client("s3", endpoint_url=endpoints["direct"], region_name="us-east-1").create_bucket(Bucket="bench")
        local = work / "ds"
        if not (local / "manifest.json").is_file():
            per_class = args.samples // 4
            write_images(work / "src", {f"c{i}": per_class for i in range(4)}, size=96)
            build(work / "src", local, BuildOptions(codec="raw:size=96x96", shard_size=32 << 20))
        url = "s3://bench/ds"
        base = dict(endpoint_url=proxy, region="us-east-1")
        upload_dataset(local, parse_url(url), RemoteOptions(**base, cache_dir=str(work / "upload-cache")))
        _control(proxy, "/__proxy__/config", {"latency_s": args.latency_ms / 1000,
                                              "bandwidth": int(args.bandwidth_mb * 1e6)})
        with packer.open_dataset(local) as dataset:
            blocks = index_blocks(dataset.index.offset, dataset.index.size, dataset.index.shard)
            order = epoch_order("block", len(dataset), seed=0, epoch=0, blocks=blocks)
            shard_bytes = sum(entry.size for entry in dataset.manifest.shards)
            shards = [entry.path for entry in dataset.manifest.shards]

        rows = []
        # the floor: one large GET per shard, the same bytes
        from packer.remote.store import store_for

        store = store_for(parse_url(url), RemoteOptions(**base))
        floor = harness.measure(lambda: [store.read_object(relative) for relative in shards], items=len(order))
        floor.extra["bytes"] = shard_bytes
        rows.append(("store floor (one GET per shard)", None, floor, len(shards)))

        for transport in ("fsspec", "obstore"):
            cache = work / f"cache-{transport}"
            shutil.rmtree(cache, ignore_errors=True)
            options = RemoteOptions(**base, transport=transport, cache_dir=str(cache))
            _control(proxy, "/__proxy__/reset", {})
            opened = time.perf_counter()
            with packer.open_dataset(url, remote=options) as remote:
                open_s = time.perf_counter() - opened
                first, stretch = _epoch(remote, order, args.batch)
            requests = len([e for e in _control(proxy, "/__proxy__/log") if e["method"] == "GET"])
            rows.append((f"cold epoch, {transport}", open_s + first, stretch, requests))
            if transport == "fsspec":
                _control(proxy, "/__proxy__/reset", {})
                opened = time.perf_counter()
                with packer.open_dataset(url, remote=options) as remote:
                    open_s = time.perf_counter() - opened
                    first, stretch = _epoch(remote, order, args.batch)
                requests = len([e for e in _control(proxy, "/__proxy__/log") if e["method"] == "GET"])
                rows.append(("warm epoch (node cache)", open_s + first, stretch, requests))
        opened = time.perf_counter()
        with packer.open_dataset(local, backend="pread") as dataset:
            open_s = time.perf_counter() - opened
            first, stretch = _epoch(dataset, order, args.batch)
        rows.append(("local-disk epoch (pread, page cache warm)", open_s + first, stretch, 0))
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=30)

    floor_rate = shard_bytes / floor.seconds
    print(f"{len(order)} samples, {shard_bytes / 1e6:.1f} MB of shards; proxy: {args.latency_ms:g} ms per request, "
          f"{args.bandwidth_mb:g} MB/s cap; machine shared (2 cores)")
    print("| run | images/s | MB/s | vs floor | CPU ms/image | first batch s | GET requests |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, first, stretch, requests in rows:
        rate = stretch.extra["bytes"] / stretch.seconds
        print(f"| {name} | {stretch.rate if first is not None else float('nan'):,.0f} | {rate / 1e6:,.1f} | "
              f"{rate / floor_rate:.2f}x | {1e3 * stretch.cpu_seconds / stretch.items:.3f} | "
              f"{'' if first is None else f'{first:.2f}'} | {requests} |")


if __name__ == "__main__":
    main()
