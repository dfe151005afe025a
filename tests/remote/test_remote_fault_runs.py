"""Seeded fault runs on the loopback S3 server (issue 38, "Done when"): slow bodies, oversize
objects, damaged cache files, concurrent appends from two processes, an overwrite during a read.
Each run ends in the same bytes as the folder (``identical``) or a PackerError naming the object
(``typed``): never short or mixed samples, never a lost append, never another exception. The counts
are printed as one line (``remote fault runs: {...}``, read by scripts/reliability_report.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import boto3
import numpy as np
import pytest

from conftest import check_loopback, options_for
from helpers import write_images

import packer
from packer.errors import PackerError
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url

REPO = Path(__file__).resolve().parents[2]
RUNS = int(os.environ.get("PACKER_FAULT_RUNS", "4"))  # seeds per fault kind (CI: 4)


def _client(s3):
    return boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def _read_all(url, options, order):
    with packer.open_dataset(url, remote=options) as remote:
        remote.plan_reads(order)
        out = []
        for position, i in enumerate(order.tolist()):
            remote.reads_advanced(position)
            out.append(bytes(remote.get(int(i))))
        return out


def _outcome(expect, run, names):
    """``identical`` / ``typed`` (a PackerError naming one of ``names``); anything else fails."""
    try:
        got = run()
    except PackerError as exc:
        text = str(exc)
        assert any(name in text for name in names), f"a typed error that names no object: {text}"
        return f"typed:{type(exc).__name__}"
    assert got == expect, "short, mixed or wrong samples"
    return "identical"


def _slow_bodies(s3, local, tmp_path, rng, expect, order, url):
    s3.configure(fault_rate=rng.choice([0.1, 0.3, 1.0]), faults=["trickle", "slow"], paths=["/shards/"],
                 trickle_s=0.5, slow_s=1.5, seed=rng.randrange(1 << 30))
    options = options_for(s3, tmp_path / f"c{rng.random()}", timeout_s=1.0, retries=rng.choice([2, 6]),
                          deadline_s=12.0, extent_bytes=32 << 10, request_bytes=64 << 10,
                          transport=rng.choice(["fsspec", "obstore"]))
    try:
        return _outcome(expect, lambda: _read_all(url, options, order), ["/shards/shard-", url])
    finally:
        s3.configure(fault_rate=0.0, paths=None)


def _oversize(s3, local, tmp_path, rng, expect, order, url):
    with packer.open_dataset(local) as dataset:
        objects = [dataset.manifest.index.path, *(entry.path for entry in dataset.manifest.shards), "manifest.json"]
    victim = rng.choice(objects)
    client = _client(s3)
    body = client.get_object(Bucket=s3.bucket, Key=f"ds/{victim}")["Body"].read()
    client.put_object(Bucket=s3.bucket, Key=f"ds/{victim}", Body=body + os.urandom(rng.randrange(1, 1 << 20)))
    try:
        options = options_for(s3, tmp_path / f"c{rng.random()}")
        return _outcome(expect, lambda: _read_all(url, options, order), [victim, url])
    finally:
        client.put_object(Bucket=s3.bucket, Key=f"ds/{victim}", Body=body)


def _damaged_cache(s3, local, tmp_path, rng, expect, order, url):
    from test_remote_cache_damage import _extent_files, damage

    cache = tmp_path / f"c{rng.random()}"
    options = options_for(s3, cache)
    _read_all(url, options, order)
    files = _extent_files(cache)
    for victim in rng.sample(files, rng.randint(1, len(files))):
        damage(victim, rng.choice(["truncate", "empty", "zero", "flip", "delete", "extend"]))
    return _outcome(expect, lambda: _read_all(url, options, order), [url])


CHILD = textwrap.dedent('''
    import json, sys, time
    from pathlib import Path
    kind, url, source, cache, barrier, me, other, delay, endpoint = sys.argv[1:10]
    import packer.remote.upload as upload
    from packer.remote import RemoteOptions
    from packer.errors import PackerError
    original, calls = upload._current_manifest, [0]
    def held(store):
        answer = original(store)
        calls[0] += 1
        if calls[0] == 2:
            Path(barrier, me).touch()
            deadline = time.monotonic() + 60
            while not Path(barrier, other).exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(float(delay))
        return answer
    upload._current_manifest = held
    options = RemoteOptions(endpoint_url=endpoint, region="us-east-1", cache_dir=cache, backoff_s=0.01, timeout_s=30.0)
    try:
        import packer
        packer.append_dataset(url, source, run=packer.RunOptions(workers=1, remote=options))
        print(json.dumps({"ok": True}))
    except PackerError as exc:
        print(json.dumps({"ok": False, "error": type(exc).__name__, "message": exc.message}))
''')


def _concurrent_appends(s3, local, tmp_path, rng, expect, order, url):
    work = tmp_path / f"w{rng.random()}"
    work.mkdir()
    name = f"ds-append-{rng.randrange(1 << 30)}"
    target = f"s3://{s3.bucket}/{name}"
    upload_dataset(local, parse_url(target), options_for(s3, work / "up"))
    sources = []
    for k in range(2):
        write_images(work / f"src{k}", {f"new{k}": rng.randint(1, 4)}, seed=rng.randrange(1000))
        sources.append(work / f"src{k}")
    (work / "child.py").write_text(CHILD)
    (work / "barrier").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("AWS_ENDPOINT_URL", None)
    delays = rng.choice([(0.0, 1.0), (1.0, 0.0), (0.0, 0.0)])
    children = [subprocess.Popen([sys.executable, str(work / "child.py"), "append", target, str(sources[k]),
                                  str(work / f"node{k}"), str(work / "barrier"), f"p{k}", f"p{1 - k}", str(delays[k]),
                                  check_loopback(s3.proxy)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env) for k in range(2)]
    results = []
    for child in children:
        out, err = child.communicate(timeout=240)
        assert child.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    winners = [k for k in range(2) if results[k]["ok"]]
    assert len(winners) >= 1, results  # never both refused
    with packer.open_dataset(target, remote=options_for(s3, work / "check")) as dataset:
        classes = set(dataset.classes)
        assert [bytes(dataset.get(i)) for i in range(len(expect))] == expect  # the base, whole
        for k in range(2):  # a reported success is in the dataset; a refusal is not, and names the change
            assert (f"new{k}" in classes) == results[k]["ok"], results
            if not results[k]["ok"]:
                assert results[k]["error"] == "DatasetChangedError", results
    return "one-committed-one-refused" if len(winners) == 1 else "both-committed-in-turn"


def _local_bytes(local):
    with packer.open_dataset(local) as dataset:
        return [bytes(dataset.get(i)) for i in range(len(dataset))]


def _overwrite_during_read(s3, local, tmp_path, rng, expect, order, url):
    work = tmp_path / f"o{rng.random()}"
    name = f"ds-over-{rng.randrange(1 << 30)}"
    target = f"s3://{s3.bucket}/{name}"
    upload_dataset(local, parse_url(target), options_for(s3, work / "up"))
    write_images(work / "new", {"other": 3}, seed=rng.randrange(1000))
    cut = rng.randrange(1, len(order))
    options = options_for(s3, work / "reader")

    def run():
        with packer.open_dataset(target, remote=options) as remote:
            remote.plan_reads(order)
            out = []
            for position, i in enumerate(order.tolist()):
                if position == cut:  # another job replaces the dataset mid-epoch
                    packer.build_dataset(work / "new", target, run=packer.RunOptions(
                        workers=1, overwrite=True, remote=options_for(s3, work / "writer")))
                remote.reads_advanced(position)
                out.append(bytes(remote.get(int(i))))
            return out

    return _outcome(expect, run, [target])


FAULTS = {"slow bodies": _slow_bodies, "oversize objects": _oversize, "damaged cache files": _damaged_cache,
          "concurrent appends": _concurrent_appends, "overwrite during a read": _overwrite_during_read}


@pytest.mark.timeout(900)
def test_seeded_fault_runs_end_in_identical_bytes_or_a_typed_error(s3, small_dataset, tmp_path):
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    expect_all = _local_bytes(small_dataset)
    counts: dict[str, Counter] = {}
    for kind, run in FAULTS.items():
        for seed in range(RUNS):
            rng = random.Random(f"{kind}-{seed}")
            order = np.asarray(random.Random(seed).sample(range(len(expect_all)), len(expect_all)), dtype=np.int64)
            expect = [expect_all[i] for i in order.tolist()]
            if kind == "concurrent appends":
                expect = expect_all
            outcome = run(s3, small_dataset, tmp_path, rng, expect, order, url)
            counts.setdefault(kind, Counter())[outcome] += 1
    summary = {kind: dict(sorted(c.items())) for kind, c in counts.items()}
    print(f"remote fault runs: {json.dumps(summary, sort_keys=True)}")
    assert sum(sum(c.values()) for c in counts.values()) == RUNS * len(FAULTS)
