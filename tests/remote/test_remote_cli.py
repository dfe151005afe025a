"""``packer build | append | inspect | verify | export | bench`` with a dataset URL, and uploads
that are killed: the previous generation (or nothing that opens) stays, and a rerun continues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import options_for
from helpers import write_images

import packer
from packer import format as fmt
from packer.cli import _register, cli
from packer.errors import RemoteStoreError
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url

_register()


@pytest.fixture
def cli_env(s3, tmp_path, monkeypatch):
    """The CLI reaches the loopback server through the standard variable; the node cache is per test."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.proxy)
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "node-cache"))
    return s3


def _run(*args: str) -> dict:
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_build_inspect_verify_export_bench_append_through_a_url(cli_env, tmp_path):
    s3 = cli_env
    write_images(tmp_path / "src", {"a": 12, "b": 12})
    write_images(tmp_path / "more", {"a": 3, "c": 4}, seed=9)
    url = f"s3://{s3.bucket}/train"
    _run("build", str(tmp_path / "src"), url, "--shard-size", "32K", "--workers", "1", "--quiet")
    assert _run("inspect", url)["samples"] == 24
    report = _run("verify", url)
    assert report["ok"] and report["path"] == url
    exported = tmp_path / "exported"
    result = CliRunner().invoke(cli, ["export", url, str(exported)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert len([p for p in exported.rglob("*") if p.is_file()]) >= 24
    bench = CliRunner().invoke(cli, ["bench", url, "--json"], catch_exceptions=False)
    assert bench.exit_code == 0, bench.output
    _run("append", url, str(tmp_path / "more"), "--quiet")
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "c2")) as dataset:
        assert len(dataset) == 28 and "c" in dataset.classes  # a/000-002 are already there
        assert all(len(dataset.get(i)) > 0 for i in range(len(dataset)))


def test_building_over_a_dataset_needs_overwrite(cli_env, tmp_path):
    write_images(tmp_path / "src", {"a": 4})
    url = f"s3://{cli_env.bucket}/ds"
    _run("build", str(tmp_path / "src"), url, "--quiet")
    result = CliRunner().invoke(cli, ["build", str(tmp_path / "src"), url, "--quiet"])
    assert result.exit_code == 2 and "already" in result.output


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_building_a_source_with_a_rejected_file_to_a_url(cli_env, tmp_path, as_json):
    """Issue 39: the upload succeeded, then the summary joined the URL string with '/' (a TypeError:
    exit 1, and an empty stdout with --json); a rerun with --resume crashed the same way. Real
    sources almost always hold a file that is rejected."""
    write_images(tmp_path / "src", {"a": 3, "b": 2})
    (tmp_path / "src" / "a" / "broken.jpg").write_bytes(b"not an image")
    url = f"s3://{cli_env.bucket}/ds"
    for again in ([], ["--resume"]):
        argv = ["build", str(tmp_path / "src"), url, "--workers", "1", "-q", *again] + (["--json"] if as_json else [])
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output
        if as_json:
            document = json.loads(result.stdout)
            assert document["ok"] and document["rejected"] == 1 and document["path"] == url
            assert document["rejected_by_reason"] == {"not-an-image": 1}
        else:
            assert f"rejected 1 file(s): 1 not-an-image; see {url}/{fmt.REPORT_NAME}" in result.stderr
    with packer.open_dataset(url, remote=options_for(cli_env, tmp_path / "reader")) as dataset:
        assert len(dataset) == 5 and dataset.manifest.build["settings"]["source"]["kind"] == "folder"


class _Killed(BaseException):
    """Stands for the process dying: raised from the upload's progress callback, it stops the upload there."""


def test_a_killed_upload_leaves_the_previous_dataset_and_a_rerun_continues(s3, small_dataset, tmp_path):
    # Deterministic, whatever the machine's load: the failures are every PUT (fault rate 1), then a
    # kill after the second object (one upload thread, so "the second" is well defined); the
    # request timeout and retries are generous so that a slow server under load is not a failure
    # (with timeout_s=5 and retries=1, a PUT answered after 5 s on a loaded machine failed the rerun).
    url = parse_url(f"s3://{s3.bucket}/ds")
    options = options_for(s3, tmp_path / "cache", retries=2, timeout_s=60.0, deadline_s=120.0)
    s3.configure(fault_rate=1.0, faults=["500"], methods=["PUT"])
    with pytest.raises(RemoteStoreError, match="upload .* failed after 2 attempts"):
        upload_dataset(small_dataset, url, options, workers=1)
    with pytest.raises(RemoteStoreError, match="manifest.json"):  # nothing that opens
        packer.open_dataset(url.text, remote=options)
    s3.configure(fault_rate=0.0)
    sent: list[str] = []

    def die_after_two(relative: str, size: int) -> None:
        sent.append(relative)
        if len(sent) == 2:
            raise _Killed()

    with pytest.raises(_Killed):
        upload_dataset(small_dataset, url, options, workers=1, on_object=die_after_two)
    with pytest.raises(RemoteStoreError, match="manifest.json"):  # still nothing that opens
        packer.open_dataset(url.text, remote=options)
    report = upload_dataset(small_dataset, url, options)
    assert sorted(report.skipped) == sorted(sent)  # continued where it was killed
    assert report.uploaded[-1] == "manifest.json" and not set(report.uploaded) & set(sent)  # the manifest last
    with packer.open_dataset(url.text, remote=options) as dataset, packer.open_dataset(small_dataset) as local:
        assert [bytes(dataset.get(i)) for i in range(len(local))] == [bytes(local.get(i)) for i in range(len(local))]


def test_overwrite_deletes_the_replaced_generations_objects_after_the_new_manifest(cli_env, tmp_path):
    import boto3

    from packer.errors import DatasetChangedError

    s3 = cli_env
    write_images(tmp_path / "old", {"a": 20, "b": 20}, size=40)
    write_images(tmp_path / "new", {"c": 6}, seed=5)
    url = f"s3://{s3.bucket}/ds"
    _run("build", str(tmp_path / "old"), url, "--shard-size", "32K", "--workers", "1", "--quiet")
    client = boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1")

    def keys() -> set[str]:
        listing = client.list_objects_v2(Bucket=s3.bucket, Prefix="ds/").get("Contents", [])
        return {entry["Key"].removeprefix("ds/") for entry in listing}

    old_keys = keys()
    reader = packer.open_dataset(url, remote=options_for(s3, tmp_path / "reader-cache"))
    first = bytes(reader.get(0))  # its extent is in the reader's node cache now
    _run("build", str(tmp_path / "new"), url, "--overwrite", "--workers", "1", "--quiet")
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "c2")) as dataset:
        new_keys = {entry.path for entry in dataset.manifest.shards} | {dataset.manifest.index.path, "manifest.json"}
        assert len(dataset) == 6 and dataset.classes == ("c",)
    assert keys() - {fmt.REPORT_NAME} == new_keys  # nothing of the old generation is left
    assert old_keys - new_keys - {fmt.REPORT_NAME}  # and there was something to delete
    assert bytes(reader.get(0)) == first  # a reader of the old generation: what its cache holds ...
    with pytest.raises(DatasetChangedError, match="new manifest generation"):
        reader.get(len(reader) - 1)  # ... and a typed refusal for the rest
    reader.close()
