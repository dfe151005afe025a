"""Two processes fill one node cache at once (issue 41): each reads every sample, in its own order,
whole and identical to the folder, and the node downloads each extent once in all (a record lock
per extent decides who fetches; the other waits and reads the file): the downloads of both
processes add up to the number of extents, and no byte range is asked of the store twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import check_loopback, options_for

import packer
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url

REPO = Path(__file__).resolve().parents[2]

READER = textwrap.dedent('''
    import hashlib, json, sys, time
    from pathlib import Path
    import numpy as np
    import packer
    from packer.remote import RemoteOptions
    url, cache, endpoint, seed, start = sys.argv[1:6]
    options = RemoteOptions(endpoint_url=endpoint, region="us-east-1", cache_dir=cache, backoff_s=0.01,
                            timeout_s=30.0, extent_bytes=16 << 10, request_bytes=32 << 10, in_flight=4)
    while time.time() < float(start):  # both begin together
        time.sleep(0.005)
    with packer.open_dataset(url, remote=options) as dataset:
        order = np.random.default_rng(int(seed)).permutation(len(dataset))
        dataset.plan_reads(order)
        digests = {}
        for position, i in enumerate(order.tolist()):
            dataset.reads_advanced(position)
            digests[i] = hashlib.sha256(bytes(dataset.get(i))).hexdigest()
        stats = dataset.remote_stats()
    print(json.dumps({"digests": [digests[i] for i in range(len(digests))], "downloads": stats["downloads"]}))
''')


@pytest.mark.timeout(300)
def test_two_processes_fill_one_cache_and_download_each_extent_once(s3, small_dataset, tmp_path):
    import hashlib
    import time

    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    script = tmp_path / "reader.py"
    script.write_text(READER)
    cache = tmp_path / "node-cache"
    s3.configure(latency_s=0.01)  # requests overlap between the two
    s3.reset()
    start = time.time() + 3
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    readers = [subprocess.Popen([sys.executable, str(script), url, str(cache), check_loopback(s3.proxy), str(seed),
                                 str(start)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for seed in (1, 2)]
    results = []
    for reader in readers:
        out, err = reader.communicate(timeout=240)
        assert reader.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    with packer.open_dataset(small_dataset) as local:
        expect = [hashlib.sha256(bytes(local.get(i))).hexdigest() for i in range(len(local))]
    with packer.open_dataset(url, remote=options_for(s3, cache, extent_bytes=16 << 10)) as remote:
        extents = len(remote.place.table(""))
    assert results[0]["digests"] == expect and results[1]["digests"] == expect
    assert results[0]["downloads"] + results[1]["downloads"] == extents, results
    ranges = [(e["path"], e["range"]) for e in s3.log() if e["method"] == "GET" and "/shards/" in e["path"]
              and e["range"] != "bytes=0-63"]
    assert len(ranges) == len(set(ranges)), "a range was fetched twice"
