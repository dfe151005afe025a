"""Duplicates of a dataset at a URL (the loopback S3 server): the same search through the read API,
the hashes kept in the node cache and never written to the store, and the CLI on a URL."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from conftest import options_for
from helpers import encode, near_copy, photo_like

from packer import format as fmt
from packer.cli import _register, cli
from packer.duplicates import find_duplicates
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url
from packer.writer import BuildOptions, build

_register()


def test_a_dataset_at_a_url_is_searched_through_the_cache(s3, small_dataset, tmp_path):
    url = parse_url(f"s3://{s3.bucket}/train")
    options = options_for(s3, tmp_path / "cache")
    upload_dataset(small_dataset, url, options)
    local = shutil.copytree(small_dataset, tmp_path / "local")
    report = find_duplicates(url.text, [local], remote=options)
    assert [e.name for e in report.datasets] == ["train", "local"]
    assert report.datasets[0].location == url.text
    exact = [g for g in report.groups if g.kind == "exact"]
    assert len(exact) == len(report.groups) == 120 and all(g.leak for g in exact)  # every sample, byte for byte
    stored = list((tmp_path / "cache").rglob(fmt.HASHES_NAME))
    assert len(stored) == 1 and report.datasets[0].hashes_source == f"computed; stored in {stored[0]}"
    import boto3

    client = boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1")
    names = [o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket)["Contents"]]
    assert not [n for n in names if n.endswith(".pkh")]  # the store holds the dataset's files only
    again = find_duplicates(url.text, [local], remote=options)
    assert again.datasets[0].hashes_source == "stored" and len(again.groups) == 120


def test_the_cli_finds_a_leak_between_two_urls(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.proxy)
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "node-cache"))
    photos = [photo_like(seed, (96, 128)) for seed in range(4)]
    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
    for number, pixels in enumerate(photos[:3]):
        (tmp_path / "train" / "a" / f"{number}.jpg").write_bytes(encode(pixels))
    (tmp_path / "val" / "a" / "copy.jpg").write_bytes(near_copy(photos[1], "resize", 1))
    (tmp_path / "val" / "a" / "new.jpg").write_bytes(encode(photos[3]))
    options = options_for(s3, tmp_path / "upload-cache")
    for split in ("train", "val"):
        build(tmp_path / split, tmp_path / "ds" / split, BuildOptions(shard_size=1 << 20), workers=1, progress=False)
        upload_dataset(tmp_path / "ds" / split, parse_url(f"s3://{s3.bucket}/{split}"), options)
    result = CliRunner().invoke(cli, ["inspect", f"s3://{s3.bucket}/train", "--duplicates", "--against",
                                      f"s3://{s3.bucket}/val", "--json"])
    assert result.exit_code == 1, result.output
    found = json.loads(result.stdout)["duplicates"]
    assert [[(m["dataset"], m["key"]) for m in g["members"]] for g in found["groups"]] == [
        [("train", "a/1.jpg"), ("val", "a/copy.jpg")]]


def test_a_url_built_with_hashes_and_duplicate_rejection_takes_an_append(s3, tmp_path):
    """--hash perceptual and --reject-duplicates recorded in a dataset at a URL: an append reads the
    samples already there through the URL (the staging folder holds the manifest and index only),
    hashes the new samples, and rejects a copy of an existing one naming it."""
    import packer
    from packer.duplicates.phash import hash_dataset
    from packer.duplicates.sidecar import load_or_compute

    photos = [photo_like(seed, (64, 80)) for seed in range(5)]
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "more" / "a").mkdir(parents=True)
    for number in range(3):
        (tmp_path / "src" / "a" / f"{number}.jpg").write_bytes(encode(photos[number]))
    shutil.copy(tmp_path / "src" / "a" / "1.jpg", tmp_path / "more" / "a" / "again-1.jpg")
    for number in (3, 4):
        (tmp_path / "more" / "a" / f"{number}.jpg").write_bytes(encode(photos[number]))
    options = options_for(s3, tmp_path / "cache")
    url = f"s3://{s3.bucket}/hashed"
    settings = packer.BuildSettings(hash="perceptual", checks=packer.CheckSettings(reject_duplicates=True))
    packer.build_dataset(tmp_path / "src", url, settings, packer.RunOptions(workers=1, remote=options))
    result = packer.append_dataset(url, tmp_path / "more", run=packer.RunOptions(workers=1, remote=options))
    assert result.sample_count == 5
    assert {r.key: (r.reason, r.message) for r in result.rejected} == {
        "a/again-1.jpg": ("duplicate-content", "the same bytes as 'a/1.jpg', already in the dataset")}
    with packer.open_dataset(url, remote=options) as dataset:
        table, source = load_or_compute(dataset, store=False)
        fresh = hash_dataset(dataset)
    # the append's hashes were kept in the node cache's folder of the new generation, not the store
    assert source == "stored"
    assert table.status.tolist() == fresh.status.tolist() == [0] * 5 and (table.hashes == fresh.hashes).all()
    import boto3

    client = boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1")
    assert not [o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket)["Contents"] if o["Key"].endswith(".pkh")]
