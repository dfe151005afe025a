"""The differential remote matrix (issue 38): each command and reader over a local folder and over
the same dataset at a URL on the loopback S3 server, with the same outcome: the same objects
written (build, append: byte for byte, the manifest included), the same summary (inspect), the
same verdict (verify, damage included), the same exported files (export, every target), the same
samples in the same order (every reader), a run of the same shape (bench). Where a URL cannot go,
the refusal is typed (tests/remote/test_remote_locations.py walks every such option)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import boto3
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import options_for
from helpers import write_images

import packer
from packer.cli import _register, cli

_register()


@pytest.fixture
def both(s3, tmp_path, monkeypatch):
    """The same source built into a folder and to a URL through the CLI: (folder, url, s3)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.proxy)
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "node-cache"))
    write_images(tmp_path / "src", {"cat": 9, "dog": 8, "emu": 7}, size=30)
    url = f"s3://{s3.bucket}/ds"
    for out in (str(tmp_path / "ds"), url):
        _ok("build", str(tmp_path / "src"), out, "--shard-size", "24K", "--workers", "1", "--quiet")
    return tmp_path / "ds", url, s3


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _ok(*args: str) -> str:
    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def _objects(s3, prefix: str) -> dict[str, str]:
    client = boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1")
    listing = client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix + "/").get("Contents", [])
    return {entry["Key"][len(prefix) + 1:]: hashlib.sha256(client.get_object(Bucket=s3.bucket, Key=entry["Key"])
                                                            ["Body"].read()).hexdigest()
            for entry in listing if not entry["Key"][len(prefix) + 1:].startswith(".packer/")}


def _files(folder: Path) -> dict[str, str]:
    return {path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and not path.name.startswith(".")}


def _same_json(local_text: str, remote_text: str, local: Path, url: str) -> tuple[dict, dict]:
    """Both documents with the dataset's location written ``<DS>`` and the timings left out."""
    documents = json.loads(local_text.replace(str(local), "<DS>")), json.loads(remote_text.replace(url, "<DS>"))
    for document in documents:
        document.pop("seconds", None)
    return documents


def test_build_and_append_write_the_same_bytes(both, tmp_path):
    local, url, s3 = both
    assert _objects(s3, "ds") == _files(local)  # every file, the manifest and the build report included
    write_images(tmp_path / "more", {"dog": 2, "fox": 3}, seed=4)
    for target in (str(local), url):
        _ok("append", target, str(tmp_path / "more"), "--quiet")
    assert _objects(s3, "ds") == _files(local)


def test_inspect_and_verify_agree(both):
    local, url, _s3 = both
    mine, theirs = _same_json(_ok("inspect", str(local), "--json"), _ok("inspect", url, "--json"), local, url)
    assert mine == theirs
    mine, theirs = _same_json(_ok("verify", str(local), "--json"), _ok("verify", url, "--json"), local, url)
    assert mine == theirs and mine["ok"]


def test_verify_reports_the_same_damage(both):
    local, url, s3 = both
    with packer.open_dataset(local) as dataset:
        info = dataset.sample_info(5)
    damaged = bytearray((local / info["shard_path"]).read_bytes())
    damaged[info["offset"] + 2] ^= 0x10
    (local / info["shard_path"]).write_bytes(bytes(damaged))
    boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1").put_object(
        Bucket=s3.bucket, Key=f"ds/{info['shard_path']}", Body=bytes(damaged))
    results = [_invoke("verify", target, "--json") for target in (str(local), url)]
    assert [r.exit_code for r in results] == [1, 1]
    mine, theirs = _same_json(results[0].stdout, results[1].stdout, local, url)
    assert mine == theirs and not mine["ok"]


@pytest.mark.parametrize("to", ["folder", "tar", "webdataset"])
def test_export_writes_the_same_files(both, tmp_path, to):
    local, url, _s3 = both
    outs = []
    for name, source in (("from-folder", str(local)), ("from-url", url)):
        out = tmp_path / name / ("out.tar" if to == "tar" else "out")
        out.parent.mkdir()
        _ok("export", source, str(out), "--to", to)
        outs.append(_files(out.parent))
    assert outs[0] == outs[1] and outs[0]


def test_bench_runs_the_same_shape(both):
    local, url, _s3 = both
    args = ["-b", "8", "-n", "3", "--warmup", "0", "--decode", "none", "--loader", "simple", "-j", "0", "--json"]
    mine, theirs = (json.loads(_ok("bench", target, *args)) for target in (str(local), url))
    for key in ("samples", "batches", "batch_size", "decode", "order"):
        assert mine.get(key) == theirs.get(key), key


def _reader_streams(dataset_path: str, options) -> dict[str, list]:
    """Every reader's samples (bytes and labels, in order) over ``dataset_path``."""
    torch = pytest.importorskip("torch")
    from packer.threaded import ThreadedLoader
    from packer.torch import PackedBatchSampler, PackedDataset, PackedIterableDataset

    remote = {"remote": options} if options is not None else {}
    out: dict[str, list] = {}
    with packer.open_dataset(dataset_path, **remote) as dataset:
        order = np.random.default_rng(3).permutation(len(dataset))
        out["dataset.read_batch"] = [bytes(dataset.read_batch(order[k:k + 5])[j]) for k in range(0, len(order), 5)
                                     for j in range(len(order[k:k + 5]))]
        mapped = PackedDataset(dataset)
        out["PackedDataset"] = [(bytes(np.asarray(mapped[i][0])), int(mapped[i][1])) for i in range(len(mapped))]
        sampler = PackedBatchSampler(mapped, batch_size=4, order="block", seed=1)
        out["PackedBatchSampler"] = [list(batch) for batch in sampler]
        iterable = PackedIterableDataset(dataset, batch_size=4, order="random", seed=2)
        out["PackedIterableDataset"] = [bytes(np.asarray(image)) for batch in iterable for image in batch[0]]
        loader = torch.utils.data.DataLoader(mapped, batch_size=None, sampler=range(len(mapped)), num_workers=2)
        out["DataLoader workers"] = [(bytes(np.asarray(image)), int(label)) for image, label in loader]
        with ThreadedLoader(dataset, batch_size=6, order="random", seed=4, threads=2) as threaded:
            out["ThreadedLoader"] = [[bytes(np.asarray(x)) for x in batch[0]] for batch in threaded]
    return out


def test_every_reader_gives_the_same_samples_in_the_same_order(both, tmp_path):
    local, url, s3 = both
    mine = _reader_streams(str(local), None)
    theirs = _reader_streams(url, options_for(s3, tmp_path / "reader-cache"))
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert mine[name] == theirs[name], name
