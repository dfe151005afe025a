"""Every command's every option that names a place, given a URL on the loopback S3 server: it works,
or it is refused with exit 2 naming the option and the URL; never a local folder named ``s3:``
(issue 38). ``inspect URL`` names the dataset by its URL and reads its build report from the bucket
(issue 39); a URL's secrets never reach a store error."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from conftest import options_for
from helpers import run_main, write_images

import packer
from packer.cli import _register, cli
from packer.errors import RemoteStoreError
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url

_register()

#: Options that may name a file without a ``click.Path`` type (``--classes`` is a file or names).
ALSO_PLACES = {("build", "classes_spec")}

#: (command, parameter) -> (argv, outcome): "works", "leak" (works, and exits 1 for the copies it
#: finds: ``{ds}`` and ``{url}`` hold the same samples), or the name the refusal gives the option.
#: ``{url}`` is a dataset URL in the test's bucket, ``{new}`` a fresh URL there, ``{src}``/``{ds}`` a
#: local source / dataset, ``{tmp}`` the test's folder (the working folder is ``{tmp}/cwd``).
WALK: dict[tuple[str, str], tuple[list[str], str]] = {
    ("build", "source"): (["build", "{url}", "{tmp}/out"], "SOURCE"),
    ("build", "out"): (["build", "{src}", "{new}", "--quiet"], "works"),
    ("build", "root"): (["build", "{src}", "{tmp}/out", "--root", "{url}"], "--root"),
    ("build", "classes_from"): (["build", "{src}", "{tmp}/out", "--classes-from", "{url}", "--quiet"], "works"),
    ("build", "classes_spec"): (["build", "{src}", "{tmp}/out", "--classes", "{url}/classes.txt"], "--classes"),
    ("build", "fields_file"): (["build", "{src}", "{tmp}/out", "--fields", "{url}/fields.json"], "--fields"),
    ("append", "dataset"): (["append", "{url}", "{more}", "--quiet"], "works"),
    ("append", "source"): (["append", "{ds}", "{url}"], "SOURCE"),
    ("append", "root"): (["append", "{ds}", "{more}", "--root", "{url}"], "--root"),
    ("export", "dataset"): (["export", "{url}", "{tmp}/exported"], "works"),
    ("export", "out"): (["export", "{ds}", "{new}"], "OUT"),
    ("export", "keys"): (["export", "{ds}", "{tmp}/exported", "--keys", "{url}/keys.txt"], "--keys"),
    ("inspect", "dataset"): (["inspect", "{url}"], "works"),
    ("inspect", "extract"): (["inspect", "{url}", "--sample", "0", "--extract", "{new}/sample.jpg"], "--extract"),
    ("inspect", "grid"): (["inspect", "{url}", "--grid", "{new}/grid.png"], "--grid"),
    ("inspect", "html"): (["inspect", "{url}", "--html", "{new}/report.html"], "--html"),
    ("inspect", "against"): (["inspect", "{ds}", "--duplicates", "--against", "{url}"], "leak"),
    ("verify", "dataset"): (["verify", "{url}"], "works"),
    ("view", "dataset"): (["view", "{url}", "{tmp}/v.pkview", "--classes", "0"], "works"),
    ("view", "out"): (["view", "{ds}", "{new}/v.pkview"], "OUT"),
    ("view", "keys"): (["view", "{ds}", "{tmp}/v.pkview", "--keys", "{url}/keys.txt"], "--keys"),
    ("view", "exclude_duplicates_of"): (["view", "{ds}", "{tmp}/v.pkview", "--exclude-duplicates-of", "{url}"],
                                        "works"),
    ("sample-data", "out"): (["sample-data", "{new}"], "OUT"),
    ("bench", "dataset"): (["bench", "{url}", "-b", "8", "-n", "2", "--warmup", "0", "--decode", "none",
                            "--loader", "simple", "-j", "0"], "works"),
}


def place_parameters() -> set[tuple[str, str]]:
    """Every (command, parameter) of the CLI whose value names a file or folder."""
    found = set()
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param.type, click.Path) or (name, param.name) in ALSO_PLACES:
                found.add((name, param.name))
    return found


def test_the_walk_covers_every_option_that_names_a_place():
    assert place_parameters() == set(WALK), "give each new path option a row in WALK (works, or its refusal)"


@pytest.fixture
def cli_env(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.proxy)
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "node-cache"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return s3


def _colons(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if ":" in path.name]


@pytest.mark.parametrize("row", sorted(WALK), ids=lambda row: "-".join(row))
def test_a_url_in_every_place_option_works_or_is_refused_by_name(row, cli_env, small_dataset, tmp_path):
    s3 = cli_env
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    write_images(tmp_path / "src", {"cat": 3, "dog": 3, "eel": 2})
    write_images(tmp_path / "more", {"cat": 2, "fox": 2}, seed=7)
    values = {"url": url, "new": f"s3://{s3.bucket}/new", "src": str(tmp_path / "src"), "more": str(tmp_path / "more"),
              "ds": str(small_dataset), "tmp": str(tmp_path)}
    argv, outcome = WALK[row]
    code, out, err = run_main([part.format(**values) for part in argv])
    if outcome == "works":
        assert code == 0, (code, out, err)
    elif outcome == "leak":
        assert code == 1 and "leaks: 120 group(s) across datasets" in out, (code, out, err)
    else:
        assert code == 2, (code, out, err)
        assert f"{outcome} needs a local path, got the URL s3://{s3.bucket}/" in err, err
    assert _colons(tmp_path / "cwd") == [] and not Path("s3:").exists()
    if row == ("build", "out"):
        with packer.open_dataset(values["new"], remote=options_for(s3, tmp_path / "c")) as built:
            assert len(built) == 8
    if row == ("build", "classes_from"):
        with packer.open_dataset(tmp_path / "out") as built:
            assert built.classes == ("cat", "dog", "eel")


@pytest.mark.parametrize("scheme", ["s3", "gs", "https", "az"])
@pytest.mark.parametrize("target", ["folder", "tar", "webdataset"])
def test_export_to_any_url_is_refused_before_anything_is_read_or_sent(scheme, target, cli_env, small_dataset,
                                                                      tmp_path):
    s3 = cli_env
    s3.reset()
    code, out, err = run_main(["export", str(small_dataset), f"{scheme}://{s3.bucket}/out", "--to", target, "--json"])
    assert code == 2 and json.loads(out)["error"] == "OptionError"
    assert f"OUT needs a local path, got the URL {scheme}://{s3.bucket}/out: an export writes a local folder" in err
    assert [e for e in s3.log() if e["method"] in ("PUT", "POST")] == []
    assert _colons(tmp_path / "cwd") == []


def test_inspect_names_a_url_dataset_by_its_url_and_reads_its_report_from_the_bucket(cli_env, tmp_path):
    s3 = cli_env
    write_images(tmp_path / "src", {"cat": 3, "dog": 2})
    (tmp_path / "src" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    url = f"s3://{s3.bucket}/ds"
    code, out, err = run_main(["build", str(tmp_path / "src"), url, "--json"])  # issue 39: a rejection, to a URL
    assert code == 0, err
    assert json.loads(out)["rejected"] == 1 and f"see {url}/build-report.jsonl" in err
    code, out, err = run_main(["inspect", url])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"dataset    {url}  (format v")
    assert any(line.startswith("rejected   1 file(s) at build time: 1 ") for line in lines), out
    assert "node-cache" not in out and "unknown (no build-report.jsonl)" not in out
    code, out, err = run_main(["inspect", url, "--json"])
    summary = json.loads(out)
    assert summary["path"] == url and summary["rejected"]["available"] and summary["rejected"]["count"] == 1
    assert summary["rejected"]["first"][0]["key"] == "cat/broken.jpg"
    s3.reset()
    assert run_main(["inspect", url, "--json"])[0] == 0  # the report is in the node cache now
    assert not [e for e in s3.log() if e["method"] == "GET" and e["path"].endswith("build-report.jsonl")]
    code, _, err = run_main(["inspect", url, "--html", str(tmp_path / "report.html")])
    assert code == 0, err
    page = (tmp_path / "report.html").read_text()
    assert url in page and "cat/broken.jpg" in page


def test_a_dataset_without_a_report_says_so(cli_env, small_dataset, tmp_path):
    import shutil

    shutil.copytree(small_dataset, tmp_path / "bare")
    (tmp_path / "bare" / "build-report.jsonl").unlink(missing_ok=True)
    url = f"s3://{cli_env.bucket}/bare"
    upload_dataset(tmp_path / "bare", parse_url(url), options_for(cli_env, tmp_path / "up"))
    with packer.open_index(url, remote=options_for(cli_env, tmp_path / "cache")) as index:
        assert index.build_report() is None and index.location == url


def test_a_store_error_never_shows_a_secret_the_transport_quotes(tmp_path):
    from packer.remote import RemoteOptions
    from packer.remote.store import Store

    secret = "SeCrEt-TOKEN-42"

    class Quoting:
        def get_range(self, key, start, end):
            raise ConnectionError(f"GET https://host/{key}?X-Amz-Signature={secret} via http://u:{secret}@proxy:3128")

        def head(self, key):
            raise PermissionError(f"403 for https://host/{key}?sig={secret}")

    store = Store(parse_url("s3://bucket/ds"), RemoteOptions(cache_dir=str(tmp_path), retries=1), transport=Quoting())
    with pytest.raises(RemoteStoreError) as caught:
        store.read_prefix("manifest.json", 100)
    assert secret not in str(caught.value)
    assert "https://host/ds/manifest.json?<redacted> via http://<redacted>@proxy:3128" in caught.value.message
    assert store.head("manifest.json") is None  # a 403 is "not there" for a HEAD; nothing printed
