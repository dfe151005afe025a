"""Benchmark: one epoch of a dataset in object storage (a loopback S3 server made to behave remote), against its peers.

moto's S3 server runs on 127.0.0.1 behind ``scripts/loopback_s3.py``'s proxy, which adds a
latency to every request and caps the bandwidth of all responses together. The same raw 96x96
samples are packed by packer, written as MosaicML Streaming (MDS) shards and as LitData chunks,
and all three are uploaded to the same bucket. Then, in interleaved rounds
(``harness.interleave``), one epoch of sample bytes (decoding left out: this is the I/O path):

- **store floor**: one large GET per packer shard, one after another (the same bytes);
- **packer cold** (an empty node cache each round) through each transport (fsspec+s3fs, obstore),
  block order, batches of ``--batch``;
- **packer warm**: the dataset opened again over a node cache that holds every extent (a restart);
- **local disk**: the same epoch from the local folder (``backend="pread"``, page cache warm);
- **MosaicML Streaming** and **LitData**, cold (an empty local cache each round), reading the same
  server through their own S3 clients (boto3), in storage order (their best case).

Each row gives the median round's images/s and MB/s, the ratios to the floor and to the local
epoch, CPU ms per image over all rounds (this process and its children, which include the
loopback server and proxy: the reader's CPU plus the store's), first-batch latency (the open or
constructor included; the epoch rates leave it out) and GET requests per epoch (the proxy's
log). The machine is shared: compare the ratios of one run, not absolute numbers across runs.

The peers need their packages, which the main ``.venv`` does not carry; run it from a venv that
has them (``.venv-bench``, git-ignored)::

    python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0 \\
        && .venv-bench/bin/pip install -e ".[remote]" "moto[server]" mosaicml-streaming litdata
    .venv-bench/bin/python benchmarks/bench_remote.py [--samples 2000] [--rounds 3] [--latency-ms 20]
        [--bandwidth-mb 200] [--only fsspec,obstore,warm,streaming,litdata] [--json FILE]

A peer that does not import is skipped with a message.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import harness
import numpy as np

SCRIPTS = harness.REPO / "scripts"
BUCKET = "bench"


def _control(proxy: str, path: str, body: dict | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(proxy + path, data=data), timeout=30) as response:
        return json.loads(response.read())


def _gets(proxy: str) -> int:
    return len([e for e in _control(proxy, "/__proxy__/log") if e["method"] == "GET"])


def _samples(local: Path) -> tuple[list[bytes], np.ndarray]:
    """Every sample's bytes and label of the packed dataset, in storage order (what the peers store)."""
    import packer

    with packer.open_dataset(local) as dataset:
        return [bytes(dataset.get(i)) for i in range(len(dataset))], np.asarray(dataset.index.label)


def _write_mds(samples: list[bytes], labels: np.ndarray, out: Path, shard_bytes: int) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int"}, size_limit=shard_bytes,
                   compression=None, hashes=[]) as writer:
        for data, label in zip(samples, labels.tolist()):
            writer.write({"image": data, "label": int(label)})


def _litdata_item(item: tuple[bytes, int]) -> dict[str, Any]:
    return {"image": item[0], "label": item[1]}


def _write_litdata(samples: list[bytes], labels: np.ndarray, out: Path, shard_bytes: int) -> None:
    import litdata

    litdata.optimize(fn=_litdata_item, inputs=list(zip(samples, labels.tolist())), output_dir=str(out),
                     chunk_bytes=shard_bytes, num_workers=1, mode="overwrite")


def _upload_folder(client: Any, folder: Path, prefix: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder).as_posix()}")


def _round(open_dataset: Callable[[], Any], epoch: Callable[[Any, float], dict[str, Any]], proxy: str,
           close: Callable[[Any], None] = lambda dataset: dataset.close(), passes: int = 1) -> harness.Stretch:
    """``passes`` times: open (timed, left out of the stretch), then one epoch measured by the harness.

    The passes' stretches add up (items, wall and CPU seconds); first-batch latency is the first
    pass's, GET requests are per pass (open included).
    """
    _control(proxy, "/__proxy__/reset", {})
    total: harness.Stretch | None = None
    for _ in range(passes):
        started = time.perf_counter()
        dataset = open_dataset()
        open_s = time.perf_counter() - started
        time.sleep(0.05)  # the open's requests settle in the server before the stretch starts

        def body() -> dict[str, Any]:
            own = time.process_time()
            result = epoch(dataset, open_s)
            return {**result, "reader_cpu_s": time.process_time() - own}
        try:
            stretch = harness.measure(body)
        finally:
            close(dataset)
        if total is None:
            total = stretch
        else:
            total = harness.Stretch(items=total.items + stretch.items, seconds=total.seconds + stretch.seconds,
                                    cpu_seconds=total.cpu_seconds + stretch.cpu_seconds,
                                    extra={**total.extra, "bytes": total.extra["bytes"] + stretch.extra["bytes"],
                                           "reader_cpu_s": total.extra["reader_cpu_s"] + stretch.extra["reader_cpu_s"]})
    assert total is not None
    total.extra["requests"] = _gets(proxy) / passes
    return total


def _packer_epoch(order: np.ndarray, batch: int) -> Callable[[Any, float], dict[str, Any]]:
    """One epoch of ``order`` in batches: planned, advanced, read (bytes only)."""
    def epoch(dataset: Any, open_s: float) -> dict[str, Any]:
        started = time.perf_counter()
        dataset.plan_reads(order)
        nbytes, first = 0, None
        for k in range(0, len(order), batch):
            dataset.reads_advanced(k)
            part = dataset.read_batch(order[k:k + batch])
            nbytes += int(part.sizes.sum())
            if first is None:
                first = open_s + time.perf_counter() - started
        return {"items": len(order), "bytes": nbytes, "first_batch_s": first}
    return epoch


def _peer_epoch(count: int, batch: int) -> Callable[[Any, float], dict[str, Any]]:
    """One pass over a peer's dataset (samples as dicts with an ``image`` bytes field)."""
    def epoch(dataset: Any, open_s: float) -> dict[str, Any]:
        started = time.perf_counter()
        nbytes, seen, first = 0, 0, None
        for sample in dataset:
            nbytes += len(sample["image"])
            seen += 1
            if first is None and seen == batch:
                first = open_s + time.perf_counter() - started
        if seen != count:
            raise RuntimeError(f"the peer read {seen} samples, expected {count}")
        return {"items": seen, "bytes": nbytes, "first_batch_s": first}
    return epoch


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--bandwidth-mb", type=float, default=200.0)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--warm-passes", type=int, default=10,
                        help="epochs per round of the warm and local rows (each reopened; one epoch is ~20 ms)")
    parser.add_argument("--shard-mb", type=int, default=32, help="shard size of packer and both peers")
    parser.add_argument("--only", default="", help="rows to run besides the floor, comma-separated: fsspec, obstore, warm (warm and local), streaming, litdata")
    parser.add_argument("--in-flight", type=int, default=None, help="RemoteOptions.in_flight (default: its default)")
    parser.add_argument("--request-mb", type=float, default=None, help="RemoteOptions.request_bytes in MiB")
    parser.add_argument("--extent-mb", type=float, default=None, help="RemoteOptions.extent_bytes in MiB")
    parser.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    only = {name for name in args.only.split(",") if name}

    sys.path.insert(0, str(harness.REPO / "tests"))
    import boto3

    import packer
    from helpers import write_images
    from packer.order import epoch_order, index_blocks
    from packer.remote import RemoteOptions, parse_url
    from packer.remote.store import store_for
    from packer.remote.upload import upload_dataset
    from packer.writer import BuildOptions, build

    work = Path(args.out or tempfile.mkdtemp(prefix="bench-remote-"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ[name] = "bench"
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    load_before = harness.machine_load()
    server = subprocess.Popen([sys.executable, str(SCRIPTS / "loopback_s3.py")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        endpoints = json.loads(server.stdout.readline())  # type: ignore[union-attr]
        proxy, direct = endpoints["proxy"], endpoints["direct"]
        if not (proxy.startswith("http://127.0.0.1:") and direct.startswith("http://127.0.0.1:")):
            raise SystemExit(f"the loopback server is not on 127.0.0.1: {endpoints}")
        client = boto3.client("s3", endpoint_url=direct, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        local = work / "ds"
        if not (local / "manifest.json").is_file():
            per_class = args.samples // 4
            write_images(work / "src", {f"c{i}": per_class for i in range(4)}, size=96)
            build(work / "src", local, BuildOptions(codec="raw:size=96x96", shard_size=args.shard_mb << 20))
        url = f"s3://{BUCKET}/ds"
        base: dict[str, Any] = dict(endpoint_url=proxy, region="us-east-1")
        for name, value in (("in_flight", args.in_flight), ("request_bytes", args.request_mb),
                            ("extent_bytes", args.extent_mb)):
            if value is not None:
                base[name] = int(value if name == "in_flight" else value * (1 << 20))
        upload_dataset(local, parse_url(url), RemoteOptions(**base, cache_dir=str(work / "upload-cache")))
        with packer.open_dataset(local) as dataset:
            blocks = index_blocks(dataset.index.offset, dataset.index.size, dataset.index.shard)
            order = epoch_order("block", len(dataset), seed=0, epoch=0, blocks=blocks)
            shard_bytes = sum(entry.size for entry in dataset.manifest.shards)
            shards = [(entry.path, entry.size) for entry in dataset.manifest.shards]
        count = len(order)

        # The peers: the same sample bytes, their formats, the same bucket.
        peers: dict[str, Callable[[], harness.Stretch]] = {}
        samples, labels = _samples(local)
        if not only or "streaming" in only:
            try:
                import streaming

                mds = work / "mds"
                if not (mds / "index.json").is_file():
                    _write_mds(samples, labels, mds, args.shard_mb << 20)
                _upload_folder(client, mds, "mds")
                os.environ["S3_ENDPOINT_URL"] = proxy  # Streaming's documented endpoint variable

                def streaming_round() -> harness.Stretch:
                    cache = work / "cache-streaming"
                    shutil.rmtree(cache, ignore_errors=True)
                    streaming.base.util.clean_stale_shared_memory()
                    return _round(lambda: streaming.StreamingDataset(
                        remote=f"s3://{BUCKET}/mds", local=str(cache), shuffle=False, batch_size=args.batch),
                        _peer_epoch(count, args.batch), proxy, close=lambda dataset: None)

                peers[f"MosaicML Streaming {streaming.__version__}, cold"] = streaming_round
            except ImportError as exc:
                print(f"MosaicML Streaming skipped: {exc}", file=sys.stderr)
        if not only or "litdata" in only:
            try:
                import litdata

                lit = work / "litdata"
                if not (lit / "index.json").is_file():
                    _write_litdata(samples, labels, lit, args.shard_mb << 20)
                _upload_folder(client, lit, "litdata")
                # LitData fetches through obstore when it is installed, with client options of its own
                # that leave plain http out ("builder error" against http://127.0.0.1, whatever
                # AWS_ALLOW_HTTP says): it runs its boto3 path here, as it does without obstore.
                import litdata.streaming.downloader as litdata_downloader

                litdata_downloader._OBSTORE_AVAILABLE = False  # type: ignore[attr-defined]

                def litdata_round() -> harness.Stretch:
                    cache = work / "cache-litdata"
                    shutil.rmtree(cache, ignore_errors=True)
                    return _round(lambda: litdata.StreamingDataset(
                        f"s3://{BUCKET}/litdata", cache_dir=str(cache), shuffle=False,
                        storage_options={"endpoint_url": proxy}), _peer_epoch(count, args.batch), proxy,
                        close=lambda dataset: None)

                peers[f"LitData {litdata.__version__}, cold"] = litdata_round
            except ImportError as exc:
                print(f"LitData skipped: {exc}", file=sys.stderr)
        del samples

        _control(proxy, "/__proxy__/config", {"latency_s": args.latency_ms / 1000,
                                              "bandwidth": int(args.bandwidth_mb * 1e6)})
        store = store_for(parse_url(url), RemoteOptions(**base))

        def floor_round() -> harness.Stretch:
            def epoch(_store: Any, _open_s: float) -> dict[str, Any]:
                nbytes = sum(len(store.read_range(relative, 0, size)) for relative, size in shards)
                return {"items": count, "bytes": nbytes, "first_batch_s": None}
            return _round(lambda: store, epoch, proxy, close=lambda _store: None)

        def cold_round(transport: str) -> Callable[[], harness.Stretch]:
            def run() -> harness.Stretch:
                cache = work / f"cache-{transport}"
                shutil.rmtree(cache, ignore_errors=True)
                options = RemoteOptions(**base, transport=transport, cache_dir=str(cache))
                return _round(lambda: packer.open_dataset(url, remote=options), _packer_epoch(order, args.batch), proxy)
            return run

        warm_options = RemoteOptions(**base, cache_dir=str(work / "cache-warm"))
        shutil.rmtree(work / "cache-warm", ignore_errors=True)
        with packer.open_dataset(url, remote=warm_options) as filled:  # fills it
            _packer_epoch(order, args.batch)(filled, 0.0)

        candidates: list[tuple[str, Callable[[], harness.Stretch]]] = [
            ("store floor (one GET per shard)", floor_round)]
        if not only or "fsspec" in only:
            candidates.append(("packer cold, fsspec (default)", cold_round("fsspec")))
        if not only or "obstore" in only:
            candidates.append(("packer cold, obstore", cold_round("obstore")))
        if not only or "warm" in only:
            candidates += [
                ("packer warm (node cache, reopened)", lambda: _round(
                    lambda: packer.open_dataset(url, remote=warm_options), _packer_epoch(order, args.batch), proxy,
                    passes=args.warm_passes)),
                ("local disk (pread, page cache warm)", lambda: _round(
                    lambda: packer.open_dataset(local, backend="pread"), _packer_epoch(order, args.batch), proxy,
                    passes=args.warm_passes))]
        candidates += list(peers.items())
        # The setup's objects (boto3's service models, the peers' modules: hundreds of thousands)
        # would be rescanned by every full collection inside a stretch; freeze them first.
        gc.collect()
        gc.freeze()
        results = harness.interleave(candidates, args.rounds, unit="images")
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=60)
    load_after = harness.machine_load()

    rows = harness.summarize(results, baseline="store floor (one GET per shard)")
    by_name = {row.name: row for row in rows}
    floor_row = by_name["store floor (one GET per shard)"]
    local_row = by_name.get("local disk (pread, page cache warm)")
    out: list[dict[str, Any]] = []
    print(f"\n{count} raw 96x96 samples, {shard_bytes / 1e6:.1f} MB of packer shards; proxy: {args.latency_ms:g} ms "
          f"per request, {args.bandwidth_mb:g} MB/s cap; {args.rounds} interleaved rounds, medians")
    print(harness.describe_load(load_before, load_after))
    print("| run | images/s | MB/s | vs floor | vs local disk | reader CPU ms/image | + server CPU | first batch s "
          "| GET requests |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        stretches = results[row.name]
        mb_s = statistics.median(s.extra["bytes"] / s.seconds for s in stretches) / 1e6
        firsts = [s.extra["first_batch_s"] for s in stretches if s.extra.get("first_batch_s") is not None]
        first = statistics.median(firsts) if firsts else None
        requests = statistics.median(s.extra["requests"] for s in stretches)
        vs_local = row.rate / local_row.rate if local_row else float("nan")
        reader_ms = 1e3 * sum(s.extra["reader_cpu_s"] for s in stretches) / row.items
        server_ms = row.cpu_ms - reader_ms
        print(f"| {row.name} | {row.rate:,.0f} | {mb_s:,.1f} | {row.rate / floor_row.rate:.2f}x | "
              f"{vs_local:.2f}x | {reader_ms:.3f} | {server_ms:.3f} | {'' if first is None else f'{first:.2f}'} | {requests:g} |")
        out.append({**row.as_dict(), "mb_per_s": mb_s, "reader_cpu_ms_per_image": reader_ms, "vs_floor": row.rate / floor_row.rate, "vs_local": vs_local,
                    "first_batch_s": first, "get_requests": requests})
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True))
    return out


if __name__ == "__main__":
    main()
