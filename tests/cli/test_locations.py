"""One location type (``packer.location``): a user's path parsed once into a local path or a URL,
and every place a URL cannot go refused with a typed error naming the option and the URL, never a
local folder named ``s3:`` (issue 38). Secrets of a URL never reach a message. No server here:
tests/remote/test_remote_locations.py walks every command's every path option against one."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from helpers import run_main, write_images

from packer.errors import OptionError, UnsafePathError
from packer.location import Location, parse_location
from packer.remote.url import redact

SECRET = "SeCrEt-TOKEN-42"


# --- the parser ----------------------------------------------------------------------------------

def test_a_path_stays_a_local_path_and_prints_as_one(tmp_path):
    for value in ("data/train", tmp_path / "ds", "./s3:/bucket/out", "C:relative", "s3"):
        location = parse_location(value, what="OUT")
        assert location.url is None and location.path == Path(value)
        assert str(location) == str(Path(value)) == location.text == os.fspath(location)
    assert parse_location(Path("s3:/bucket")).path == Path("s3:/bucket")  # a Path is never a URL


def test_a_url_is_parsed_once_and_file_urls_are_local_paths(tmp_path):
    location = parse_location("s3://bucket/a/ds/", what="OUT")
    assert location.path is None and (location.url.scheme, location.url.bucket, location.url.prefix) == (
        "s3", "bucket", "a/ds")
    assert str(location) == location.text == "s3://bucket/a/ds"
    assert parse_location(location, what="other") is location  # parsed once: a Location passes through
    assert parse_location(f"file://{tmp_path}/ds").path == tmp_path / "ds"
    assert parse_location("file://localhost/x").path == Path("/x")
    assert pickle.loads(pickle.dumps(location)) == location
    assert location == parse_location("s3://bucket/a/ds", what="DATASET")  # `what` is not part of equality


def test_a_child_location_joins_a_name_on_either_side(tmp_path):
    assert (parse_location(tmp_path) / "build-report.jsonl").path == tmp_path / "build-report.jsonl"
    child = parse_location("gs://bucket/ds") / "build-report.jsonl"
    assert str(child) == "gs://bucket/ds/build-report.jsonl" and child.url.prefix == "ds/build-report.jsonl"
    with pytest.raises(UnsafePathError, match="does not stay inside the dataset"):
        parse_location("gs://bucket/ds") / "../other"  # noqa: B018


@pytest.mark.parametrize("text", ["s3:/bucket/out", "gs:bucket/out", "HTTPS:/host/ds", "file:/tmp/x", "az:c/p"])
def test_a_url_with_a_slash_missing_is_refused_not_taken_for_a_folder(text):
    with pytest.raises(OptionError) as caught:
        parse_location(text, what="OUT")
    scheme = text.split(":")[0].lower()
    assert caught.value.message == (f"OUT {text!r} looks like a URL with a slash missing ({scheme}://...); for a "
                                    f"local path of that name write ./{text}")


@pytest.mark.parametrize("value, message", [
    ("ftp://host/ds", "the dataset: unsupported URL scheme 'ftp' in 'ftp://host/ds'"),
    ("s3://[bucket/ds", "the dataset: 's3://[bucket/ds' is not a URL packer can read (Invalid IPv6 URL)"),
    (42, "the dataset must be a path or a URL (a string or a pathlib.Path), got int"),
    (b"/tmp/ds", "the dataset must be a path or a URL (a string or a pathlib.Path), got bytes"),
])
def test_what_is_neither_a_path_nor_a_usable_url_is_refused(value, message):
    with pytest.raises(OptionError) as caught:
        parse_location(value, what="the dataset")
    assert caught.value.message.startswith(message), caught.value.message


def test_a_url_where_only_a_local_path_works_is_a_typed_refusal():
    location = parse_location("s3://bucket/report.html", what="--html")
    with pytest.raises(OptionError) as caught:
        location.local_path("the report is written to a local file")
    assert caught.value.message == ("--html needs a local path, got the URL s3://bucket/report.html: the report is "
                                    "written to a local file")
    with pytest.raises(OptionError, match="^--html needs a local path, got the URL s3://bucket/report.html$"):
        Path(location)  # os.fspath: code that opens local files refuses a URL, never makes "s3:"
    assert location.check_local(lambda path: path / "never") is location  # a URL is checked where it is opened


def test_a_location_is_exactly_one_of_a_path_and_a_url():
    with pytest.raises(OptionError, match="give exactly one of path= and url="):
        Location()


# --- secrets -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    (f"https://host/ds?X-Amz-Signature={SECRET}&X-Amz-Credential=AKIA", "https://host/ds?<redacted>"),
    (f"s3://AKIA:{SECRET}@bucket/ds", "s3://<redacted>@bucket/ds"),
    (f"http://user:{SECRET}@127.0.0.1:9000/x#{SECRET}", "http://<redacted>@127.0.0.1:9000/x#<redacted>"),
    (f"az://c/p?sv=2024&sig={SECRET}", "az://c/p?<redacted>"),
    ("s3://bucket/ds", "s3://bucket/ds"),
])
def test_redact_hides_user_info_and_query_of_every_url_in_a_text(text, shown):
    assert redact(f"GET '{text}' failed; again {text}") == f"GET '{shown}' failed; again {shown}"


@pytest.mark.parametrize("text", [f"https://host/ds?X-Amz-Signature={SECRET}", f"s3://key:{SECRET}@bucket/ds",
                                  f"s3://bucket/ds#{SECRET}", f"file://u:{SECRET}@server/ds"])
def test_no_refusal_of_a_url_repeats_its_secret(text):
    import packer

    for call in (lambda: parse_location(text), lambda: packer.open_dataset(text), lambda: packer.open_index(text)):
        with pytest.raises(OptionError) as caught:
            call()
        assert SECRET not in str(caught.value)


def test_remote_options_never_show_an_endpoints_user_info():
    from packer.remote import RemoteOptions

    shown = repr(RemoteOptions(endpoint_url=f"http://user:{SECRET}@127.0.0.1:9000"))
    assert SECRET not in shown and "endpoint_url='http://<redacted>@127.0.0.1:9000'" in shown


# --- the node cache folder -----------------------------------------------------------------------

def test_a_cache_folder_that_is_a_url_or_a_file_is_refused_naming_the_setting(tmp_path, monkeypatch):
    from packer.remote import RemoteOptions

    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(OptionError) as caught:
        RemoteOptions(cache_dir=str(tmp_path / "file" / "cache")).cache_root  # noqa: B018
    assert caught.value.message == f"RemoteOptions.cache_dir is not a folder: {tmp_path / 'file'} is a file"
    assert caught.value.path == str(tmp_path / "file" / "cache")
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(OptionError) as caught:
        RemoteOptions().cache_root  # noqa: B018
    assert caught.value.message == f"$PACKER_CACHE_DIR is not a folder: {tmp_path / 'file'} is a file"
    monkeypatch.setenv("PACKER_CACHE_DIR", f"s3://bucket/cache?sig={SECRET}")
    with pytest.raises(OptionError) as caught:
        RemoteOptions().cache_root  # noqa: B018
    assert caught.value.message.startswith("$PACKER_CACHE_DIR must be a local folder, got the URL "
                                           "s3://bucket/cache?<redacted>")
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "new" / "cache"))
    assert RemoteOptions().cache_root == tmp_path / "new" / "cache"  # not there yet: made when first used


def test_open_dataset_refuses_a_bad_cache_folder_before_any_request(tmp_path, monkeypatch):
    import packer

    (tmp_path / "file").write_bytes(b"x")
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "file"))
    code, out, err = run_main(["inspect", "s3://bucket-that-is-never-asked/ds"])  # no endpoint: no request made
    assert code == 2 and err.strip() == f"error: {tmp_path / 'file'}: $PACKER_CACHE_DIR is not a folder: " \
                                        f"{tmp_path / 'file'} is a file"
    with pytest.raises(OptionError, match="is not a folder"):
        packer.open_dataset("s3://bucket-that-is-never-asked/ds")


# --- the command line: what cannot take a URL is refused naming the option -------------------------

@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    from packer.writer import BuildOptions, build

    root = tmp_path_factory.mktemp("locations")
    write_images(root / "src", {"a": 3, "b": 2})
    build(root / "src", root / "ds", BuildOptions(), workers=1)
    return root


def _places_with_a_colon(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if ":" in path.name]


@pytest.mark.parametrize("argv, option", [
    (["build", "{url}", "{tmp}/out"], "SOURCE"),
    (["build", "{src}", "{tmp}/out", "--root", "{url}"], "--root"),
    (["build", "{src}", "{tmp}/out", "--fields", "{url}"], "--fields"),
    (["build", "{src}", "{tmp}/out", "--classes", "{url}"], "--classes"),
    (["append", "{tmp}/copy", "{url}"], "SOURCE"),
    (["append", "{tmp}/copy", "{src}", "--root", "{url}"], "--root"),
    (["export", "{ds}", "{url}"], "OUT"),
    (["export", "{ds}", "{url}", "--to", "tar"], "OUT"),
    (["export", "{ds}", "{url}", "--to", "webdataset"], "OUT"),
    (["export", "{ds}", "{tmp}/exported", "--keys", "{url}"], "--keys"),
    (["inspect", "{ds}", "--sample", "0", "--extract", "{url}"], "--extract"),
    (["inspect", "{ds}", "--grid", "{url}"], "--grid"),
    (["inspect", "{ds}", "--html", "{url}"], "--html"),
    (["view", "{ds}", "{url}"], "OUT"),
    (["view", "{ds}", "{tmp}/v.pkview", "--keys", "{url}"], "--keys"),
])
@pytest.mark.parametrize("url", ["s3://bucket/out", "gs://bucket/out", "https://host/out", "az://c/out"])
def test_an_option_that_needs_a_local_path_refuses_a_url_by_name(argv, option, url, local_dataset, tmp_path,
                                                                  monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(local_dataset / "ds", tmp_path / "copy")
    values = {"url": url, "tmp": str(tmp_path), "src": str(local_dataset / "src"), "ds": str(local_dataset / "ds")}
    code, out, err = run_main([part.format(**values) for part in argv] + ["--json"])
    assert code == 2, (code, out, err)
    assert f"{option} needs a local path, got the URL {url}" in err
    assert _places_with_a_colon(tmp_path) == [] and not (tmp_path / "exported").exists()
    if out:  # a --json run prints one JSON document, even for a usage error
        import json

        assert json.loads(out)["ok"] is False


def test_export_to_a_url_says_why_and_reaches_no_store(local_dataset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["export", str(local_dataset / "ds"), "s3://bucket/out", "--to", "tar"])
    assert code == 2 and err.strip() == (
        "error: OUT needs a local path, got the URL s3://bucket/out: an export writes a local folder or tar (not a "
        "packer dataset, so there is no manifest to upload last and a half-uploaded export could not be told from "
        "a whole one); export to a local path, then copy it up with your store's tool (aws s3 cp --recursive, "
        "gcloud storage cp -r, ...)")
    from packer.export import export

    with pytest.raises(OptionError, match="^OUT needs a local path, got the URL gs://bucket/out: an export"):
        export(local_dataset / "ds", "gs://bucket/out")
    assert _places_with_a_colon(tmp_path) == []


@pytest.mark.parametrize("argv", [
    ["export", "{ds}", "{secret}"], ["inspect", "{ds}", "--html", "{secret}"], ["inspect", "{secret}"],
    ["build", "{src}", "{secret}"], ["export", "{ds}", "{tmp}/e", "--keys", "{secret}"],
    ["build", "{src}", "{tmp}/o", "--classes", "{secret}"], ["build", "{src}", "{tmp}/o", "--classes-from", "{secret}"],
])
@pytest.mark.parametrize("secret", [f"https://host/x?X-Amz-Signature={SECRET}", f"s3://AKIA:{SECRET}@bucket/x",
                                    f"s3:/bucket/x?sig={SECRET}"])
def test_a_signed_url_on_the_command_line_never_prints_its_token(argv, secret, local_dataset, tmp_path,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    values = {"secret": secret, "tmp": str(tmp_path), "src": str(local_dataset / "src"),
              "ds": str(local_dataset / "ds")}
    for extra in ([], ["--json"]):
        code, out, err = run_main([part.format(**values) for part in argv] + extra)
        assert code == 2, (code, out, err)
        assert SECRET not in out + err
    assert _places_with_a_colon(tmp_path) == []


def test_a_dataset_argument_that_names_its_manifest_means_its_folder(local_dataset):
    import json

    for command in ("inspect", "verify"):
        code, out, _ = run_main([command, str(local_dataset / "ds" / "manifest.json"), "--json"])
        assert code == 0 and json.loads(out)["path"] == str(local_dataset / "ds")


def test_build_to_a_file_url_builds_the_folder(local_dataset, tmp_path):
    code, _, err = run_main(["build", str(local_dataset / "src"), f"file://{tmp_path}/out", "--quiet"])
    assert code == 0, err
    assert (tmp_path / "out" / "manifest.json").is_file()
