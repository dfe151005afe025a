"""Dataset URLs and ``RemoteOptions`` as values (``packer.remote.url``, ``packer.remote.options``):
which strings are URLs, how each scheme splits into bucket and key prefix, which keys stay inside a
dataset, what a redacted URL shows, and every option's accepted and refused values with the exact
message. Pure functions: no store is reached."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packer.errors import OptionError, UnsafePathError
from packer.remote import RemoteOptions
from packer.remote.options import TRANSPORTS, as_remote_options, default_cache_dir
from packer.remote.url import SCHEMES, WRITABLE_SCHEMES, DatasetURL, is_url, object_key, parse_url, redact

# --- which strings are URLs -----------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    ("s3://bucket/ds", True), ("S3://bucket", True), ("a+b.c-d://x", True), ("z9://", True),
    ("X://y", True), ("gs://b", True),
    ("9s://bucket", False), ("+s://bucket", False), ("s3:/bucket", False), ("s3//bucket", False),
    (" s3://bucket", False), ("bucket/ds", False), ("", False), ("s_3://bucket", False),
    (Path("s3://bucket"), False), (b"s3://bucket", False), (None, False), (3, False),
])
def test_is_url(value, expected):
    assert is_url(value) is expected


def test_the_schemes():
    assert SCHEMES == ("s3", "gs", "az", "https", "http", "file")
    assert WRITABLE_SCHEMES == ("s3", "gs", "az", "file")


# --- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, scheme, bucket, prefix, stored", [
    ("s3://bucket/ds", "s3", "bucket", "ds", "s3://bucket/ds"),
    ("s3://bucket/a/b/", "s3", "bucket", "a/b", "s3://bucket/a/b"),
    ("S3://Bucket/A", "s3", "Bucket", "A", "S3://Bucket/A"),
    ("gs://bucket", "gs", "bucket", "", "gs://bucket"),
    ("gs://bucket/", "gs", "bucket", "", "gs://bucket"),
    ("az://container/x%20y", "az", "container", "x y", "az://container/x%20y"),
    ("https://127.0.0.1:8000/data/ds", "https", "127.0.0.1:8000", "data/ds", "https://127.0.0.1:8000/data/ds"),
    ("http://host/ds", "http", "host", "ds", "http://host/ds"),
    ("file:///tmp/ds/", "file", "", "/tmp/ds", "file:///tmp/ds"),
    ("file://localhost/tmp/ds", "file", "", "/tmp/ds", "file://localhost/tmp/ds"),
    ("file:///a%20b", "file", "", "/a b", "file:///a%20b"),
    ("file:///", "file", "", "/", "file:///"),  # was "file:" (every slash stripped), not a URL
    ("file://localhost/", "file", "", "/", "file://localhost/"),
    ("file://", "file", "", "/", "file://"),
    # names that begin or end with the letters a mutant might strip along with the slashes
    ("s3://bucket/Xa/bX", "s3", "bucket", "Xa/bX", "s3://bucket/Xa/bX"),
    ("s3://bucket/XX/", "s3", "bucket", "XX", "s3://bucket/XX"),
    ("file:///tmp/dX", "file", "", "/tmp/dX", "file:///tmp/dX"),
    ("file:///tmp/XX/", "file", "", "/tmp/XX", "file:///tmp/XX"),
    ("gs://bX", "gs", "bX", "", "gs://bX"),
])
def test_a_url_splits_into_scheme_bucket_and_prefix(text, scheme, bucket, prefix, stored):
    url = parse_url(text)
    assert (url.scheme, url.bucket, url.prefix, url.text) == (scheme, bucket, prefix, stored)
    assert str(url) == stored
    assert url == DatasetURL(text=stored, scheme=scheme, bucket=bucket, prefix=prefix)


def test_a_path_like_is_parsed_by_its_text():
    class Spelled(os.PathLike):
        def __fspath__(self) -> str:
            return "s3://bucket/ds"

    assert parse_url(Spelled()).prefix == "ds"


@pytest.mark.parametrize("scheme, read_only", [("s3", False), ("gs", False), ("az", False), ("file", False),
                                               ("https", True), ("http", True)])
def test_read_only_schemes(scheme, read_only):
    text = "file:///tmp/x" if scheme == "file" else f"{scheme}://bucket/ds"
    assert parse_url(text).read_only is read_only


@pytest.mark.parametrize("text, message", [
    ("bucket/ds", "'bucket/ds' is not a URL (expected scheme://bucket/path with scheme one of "
                  "s3, gs, az, https, http, file)"),
    ("ftp://host/ds", "unsupported URL scheme 'ftp' in 'ftp://host/ds'; packer reads s3://, gs://, az://, https://, "
                      "http://, file://"),
    ("s3://bucket/ds?versionId=3", "a dataset URL takes no query or fragment: 's3://bucket/ds?<redacted>' (store "
                                   "options go in RemoteOptions, credentials come from the environment)"),
    ("s3://bucket/ds#frag", "a dataset URL takes no query or fragment: 's3://bucket/ds#<redacted>' (store options "
                            "go in RemoteOptions, credentials come from the environment)"),
    ("file://server/share", "a file:// URL names a local folder (file:///path), got host 'server'"),
    ("file://me:pw@server/share", "a file:// URL names a local folder (file:///path), got host '<redacted>@server'"),
    ("s3://key:secret@bucket/ds", "credentials do not go in a dataset URL; they come from the environment or the "
                                  "store's standard credential chain"),
    ("s3:///ds", "no bucket in 's3:///ds'"),
    ("https:///ds", "no host in 'https:///ds'"),
    ("http:///ds", "no host in 'http:///ds'"),
    ("s3://bucket/a/../b", "the path of 's3://bucket/a/../b' is not a plain key prefix"),
    ("s3://bucket/./b", "the path of 's3://bucket/./b' is not a plain key prefix"),
    ("s3://bucket/a/.", "the path of 's3://bucket/a/.' is not a plain key prefix"),
    ("gs://bucket/a//b", "the path of 'gs://bucket/a//b' is not a plain key prefix"),
    ("s3://[bucket/ds", "'s3://[bucket/ds' is not a URL packer can read (Invalid IPv6 URL)"),
])
def test_every_refusal_of_a_url_is_named(text, message):
    with pytest.raises(OptionError) as caught:
        parse_url(text)
    assert caught.value.message == message
    assert caught.value.path is None


def test_dot_names_inside_a_prefix_are_plain_keys():
    assert parse_url("s3://bucket/a.b/..c/.d").prefix == "a.b/..c/.d"


# --- keys ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix, relative, key", [
    ("ds", "shards/shard-00000.pks", "ds/shards/shard-00000.pks"),
    ("a/b", "index.pki", "a/b/index.pki"),
    ("", "manifest.json", "manifest.json"),
    ("ds", "a..b/.c", "ds/a..b/.c"),
])
def test_object_keys(prefix, relative, key):
    assert object_key(prefix, relative) == key
    assert DatasetURL(text="s3://b", scheme="s3", bucket="b", prefix=prefix).key(relative) == key


@pytest.mark.parametrize("relative", ["", "/etc/passwd", "a\\b", "..", "../x", "a/../../x", "a/.."])
def test_a_key_out_of_the_dataset_names_the_url(relative):
    with pytest.raises(UnsafePathError) as caught:
        parse_url("s3://bucket/ds").key(relative)
    assert caught.value.message == f"path {relative!r} does not stay inside the dataset"
    assert caught.value.path == "s3://bucket/ds"
    with pytest.raises(UnsafePathError) as caught:
        object_key("ds", relative)
    assert caught.value.path is None


def test_local_path_of_a_file_url_and_not_of_a_bucket():
    assert parse_url("file:///tmp/ds").local_path == "/tmp/ds"
    with pytest.raises(OptionError) as caught:
        parse_url("s3://bucket/ds").local_path  # noqa: B018
    assert caught.value.message == "s3://bucket/ds is not a file:// URL"


# --- redaction -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, shown", [
    ("s3://bucket/ds", "s3://bucket/ds"),
    ("http://key:secret@127.0.0.1:9000/b", "http://<redacted>@127.0.0.1:9000/b"),
    ("http://a@b@host/p", "http://<redacted>@host/p"),
    ("http://uXser:pw@host/p", "http://<redacted>@host/p"),
    ("https://host/ob?X-Amz-Signature=abc", "https://host/ob?<redacted>"),
    ("https://host/ob#tok", "https://host/ob#<redacted>"),
    ("https://host/o?a#b", "https://host/o?<redacted>"),
    ("https://host/o#a?b", "https://host/o#<redacted>"),
    ("https://user:pw@host?sig=1", "https://<redacted>@host?<redacted>"),
    ("https://user:pw@host#frag", "https://<redacted>@host#<redacted>"),
    ("https://host/XX/X", "https://host/XX/X"),
    ("https://u:p@host", "https://<redacted>@host"),
    ("see 'http://k:s@h/x?q' and <s3://a:b@c/d>", "see 'http://<redacted>@h/x?<redacted>' and <s3://<redacted>@c/d>"),
    ("a `gs://u:p@b/k` b \"az://u:p@c\" end", "a `gs://<redacted>@b/k` b \"az://<redacted>@c\" end"),
    ("x http://u:p@h/a b", "x http://<redacted>@h/a b"),
    ("no url here", "no url here"),
    ("https://host/p?next=s3://k:s@b", "https://host/p?<redacted>"),  # a URL inside a query is the query's
    ("https://host/a@b/c", "https://host/a@b/c"),  # an @ in the path is not user-info
    ("file:///a@b/c", "file:///a@b/c"),
    ("https://h/p?a?b", "https://h/p?<redacted>"),
    ("https://h/p#a#b", "https://h/p#<redacted>"),
])
def test_redact_hides_user_info_and_queries(text, shown):
    assert redact(text) == shown


# --- RemoteOptions -----------------------------------------------------------------------------------


def test_the_defaults():
    options = RemoteOptions()
    assert (options.endpoint_url, options.region, dict(options.storage_options), options.transport,
            options.cache_dir, options.cache_bytes) == (None, None, {}, "fsspec", None, 0)
    assert (options.extent_bytes, options.request_bytes, options.in_flight, options.lookahead_bytes) == (
        4 << 20, 16 << 20, 8, 256 << 20)
    assert (options.retries, options.deadline_s, options.timeout_s, options.backoff_s) == (8, 120.0, 30.0, 0.05)
    assert TRANSPORTS == ("fsspec", "obstore")


@pytest.mark.parametrize("changes", [
    {"endpoint_url": "http://127.0.0.1:9000"}, {"endpoint_url": "HTTPS://host"}, {"endpoint_url": "https://h/path"},
    {"region": "us-east-1"}, {"storage_options": {"anon": True}}, {"transport": "obstore"},
    {"extent_bytes": 1, "request_bytes": 1, "in_flight": 1, "lookahead_bytes": 1, "retries": 1},
    {"cache_bytes": 0}, {"cache_bytes": 1}, {"deadline_s": 1e-9, "timeout_s": 1, "backoff_s": 0.5},
])
def test_accepted_options(changes):
    options = RemoteOptions(**changes)
    for name, value in changes.items():
        assert getattr(options, name) == value


@pytest.mark.parametrize("changes, message", [
    ({"endpoint_url": "ftp://host"}, "RemoteOptions.endpoint_url must be an http:// or https:// URL of the store "
                                     "(e.g. http://127.0.0.1:9000), got 'ftp://host'"),
    ({"endpoint_url": "http://"}, "RemoteOptions.endpoint_url must be an http:// or https:// URL of the store "
                                  "(e.g. http://127.0.0.1:9000), got 'http://'"),
    ({"endpoint_url": "http:///path"}, "RemoteOptions.endpoint_url must be an http:// or https:// URL of the store "
                                       "(e.g. http://127.0.0.1:9000), got 'http:///path'"),
    ({"endpoint_url": b"http://h"}, "RemoteOptions.endpoint_url must be an http:// or https:// URL of the store "
                                    "(e.g. http://127.0.0.1:9000), got b'http://h'"),
    ({"region": ""}, "RemoteOptions.region must be a region name such as 'us-east-1', got ''"),
    ({"region": 5}, "RemoteOptions.region must be a region name such as 'us-east-1', got 5"),
    ({"storage_options": {1: "x"}}, "RemoteOptions.storage_options must be a dict of the transport client's "
                                    "keyword arguments, got dict"),
    ({"storage_options": None}, "RemoteOptions.storage_options must be a dict of the transport client's "
                                "keyword arguments, got NoneType"),
    ({"transport": "FSSPEC"}, "unknown transport 'FSSPEC'; choose one of fsspec, obstore"),
    ({"extent_bytes": 0}, "RemoteOptions.extent_bytes must be a positive integer, got 0"),
    ({"request_bytes": 1.0}, "RemoteOptions.request_bytes must be a positive integer, got 1.0"),
    ({"in_flight": False}, "RemoteOptions.in_flight must be a positive integer, got False"),
    ({"lookahead_bytes": -1}, "RemoteOptions.lookahead_bytes must be a positive integer, got -1"),
    ({"retries": 0}, "RemoteOptions.retries must be a positive integer, got 0"),
    ({"cache_bytes": -1}, "RemoteOptions.cache_bytes must be 0 (no bound) or a positive integer, got -1"),
    ({"cache_bytes": 1.5}, "RemoteOptions.cache_bytes must be 0 (no bound) or a positive integer, got 1.5"),
    ({"deadline_s": 0}, "RemoteOptions.deadline_s must be a positive number, got 0"),
    ({"timeout_s": -1.0}, "RemoteOptions.timeout_s must be a positive number, got -1.0"),
    ({"backoff_s": None}, "RemoteOptions.backoff_s must be a positive number, got None"),
    ({"backoff_s": float("nan")}, "RemoteOptions.backoff_s must be a positive number, got nan"),
])
def test_refused_options_name_the_setting(changes, message):
    with pytest.raises(OptionError) as caught:
        RemoteOptions(**changes)
    assert caught.value.message == message


def test_request_bytes_is_raised_to_the_extent_and_kept_above_it():
    assert RemoteOptions(extent_bytes=100, request_bytes=99).request_bytes == 100
    assert RemoteOptions(extent_bytes=100, request_bytes=100).request_bytes == 100
    assert RemoteOptions(extent_bytes=100, request_bytes=101).request_bytes == 101


def test_repr_hides_storage_options_and_endpoint_secrets():
    options = RemoteOptions(endpoint_url="http://key:secret@127.0.0.1:9000", storage_options={"key": "K", "secret": "S"})
    shown = repr(options)
    assert shown.startswith("RemoteOptions(endpoint_url='http://<redacted>@127.0.0.1:9000', region=None, ")
    assert shown.endswith(", backoff_s=0.05, storage_options=<2 keys>)")
    assert "secret" not in shown and "'K'" not in shown
    assert repr(RemoteOptions()).endswith("timeout_s=30.0, backoff_s=0.05)")
    assert "transport='fsspec', cache_dir=None, cache_bytes=0, extent_bytes=4194304" in repr(RemoteOptions())


def test_with_changes_fields_and_checks_them():
    options = RemoteOptions(in_flight=2)
    changed = options.with_(in_flight=3, region="eu-west-1")
    assert (changed.in_flight, changed.region, options.in_flight) == (3, "eu-west-1", 2)
    with pytest.raises(OptionError):
        options.with_(in_flight=0)


def test_as_remote_options():
    assert as_remote_options(None) == RemoteOptions()
    given = RemoteOptions(in_flight=3)
    assert as_remote_options(given) is given
    assert as_remote_options({"in_flight": 5, "region": "r"}) == RemoteOptions(in_flight=5, region="r")
    with pytest.raises(OptionError) as caught:
        as_remote_options({"zeta": 1, "alpha": 2, "in_flight": 1})
    assert caught.value.message.startswith("unknown remote option(s) alpha, zeta; known: backoff_s, cache_bytes, ")
    assert caught.value.message.endswith(", storage_options, timeout_s, transport")
    with pytest.raises(OptionError) as caught:
        as_remote_options(("in_flight", 2))
    assert caught.value.message == "remote= takes RemoteOptions or a dict, got tuple"


def test_the_default_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "p"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "p"
    monkeypatch.setenv("PACKER_CACHE_DIR", "")
    assert default_cache_dir() == tmp_path / "x" / "packer"
    monkeypatch.delenv("PACKER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "packer"


def test_the_cache_root_follows_the_setting_then_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "env"))
    assert RemoteOptions(cache_dir=str(tmp_path / "set" / "deep")).cache_root == tmp_path / "set" / "deep"
    assert (tmp_path / "set" / "deep").is_dir()
    assert RemoteOptions().cache_root == tmp_path / "env"
    assert RemoteOptions(cache_dir="").cache_root == tmp_path / "env"
    monkeypatch.delenv("PACKER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert RemoteOptions().cache_root == tmp_path / "xdg" / "packer"
    assert (tmp_path / "xdg" / "packer").is_dir()


def test_a_cache_setting_that_is_a_url_or_a_file_is_named(monkeypatch, tmp_path):
    with pytest.raises(OptionError) as caught:
        RemoteOptions(cache_dir="s3://k:s@bucket/cache").cache_root  # noqa: B018
    assert caught.value.message == ("RemoteOptions.cache_dir must be a local folder, got the URL "
                                    "s3://<redacted>@bucket/cache (the node cache holds the files every process of "
                                    "the node maps)")
    (tmp_path / "file").write_bytes(b"x")
    for setting in (tmp_path / "file", tmp_path / "file" / "below" / "deeper"):
        with pytest.raises(OptionError) as caught:
            RemoteOptions(cache_dir=str(setting)).cache_root  # noqa: B018
        assert caught.value.message == f"RemoteOptions.cache_dir is not a folder: {tmp_path / 'file'} is a file"
        assert caught.value.path == str(setting)
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(OptionError) as caught:
        RemoteOptions().cache_root  # noqa: B018
    assert caught.value.message == f"$PACKER_CACHE_DIR is not a folder: {tmp_path / 'file'} is a file"
    monkeypatch.delenv("PACKER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    with pytest.raises(OptionError) as caught:
        RemoteOptions().cache_root  # noqa: B018
    assert caught.value.message == (f"the default cache folder ($XDG_CACHE_HOME or ~/.cache) is not a folder: "
                                    f"{tmp_path / 'file'} is a file")


def test_a_cache_folder_that_cannot_be_created_or_written_is_named(tmp_path, monkeypatch):
    with pytest.raises(OptionError) as caught:
        RemoteOptions(cache_dir="/proc/no-such-cache").cache_root  # noqa: B018
    assert caught.value.message == ("RemoteOptions.cache_dir cannot be created (No such file or directory): the node "
                                    "cache must be a writable local folder")
    assert caught.value.path == "/proc/no-such-cache"
    # root writes into a read-only folder: what the user may do is asked of os.access
    from packer.remote import options as options_module

    asked = []
    monkeypatch.setattr(options_module.os, "access", lambda path, mode: asked.append((str(path), mode)) or False)
    with pytest.raises(OptionError) as caught:
        RemoteOptions(cache_dir=str(tmp_path)).cache_root  # noqa: B018
    assert caught.value.message == ("RemoteOptions.cache_dir is not writable by this user: the node cache must be "
                                    "a writable local folder")
    assert caught.value.path == str(tmp_path)
    assert asked == [(str(tmp_path), os.W_OK | os.X_OK)]
