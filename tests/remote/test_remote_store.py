"""The transport layer's policies (``packer.remote.store``), in process: how many attempts a failure
gets and how long each pause is (backoff doubling to its cap, jitter, the deadline), which verdict
makes which message, what each ``Store`` method does with a missing object, a refusal or a failed
precondition, which client ``store_for`` shares, and what each transport asks of the library under
it (stand-ins for fsspec's filesystems and obstore record the calls; a web server on 127.0.0.1
answers range requests with the statuses a real one sends)."""

from __future__ import annotations

import errno
import os
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from conftest import check_loopback, fake_fsspec_store

from packer.errors import OptionError, PackerError, RemoteStoreError
from packer.remote import RemoteOptions, parse_url
from packer.remote import store as store_module
from packer.remote.store import (DENIED, FINAL, MISSING, NO_RANGE, PRECONDITION, RETRY, UNSATISFIABLE, FsspecTransport,
                                 ObjectInfo, ObstoreTransport, PreconditionFailed, Store, _first_line, _HttpStatus,
                                 _NoRange, _Oversize, _Timeout, classify, store_for)

URL = parse_url("s3://bucket/ds")


class Scripted:
    """A transport whose every call takes the next item of ``script``: an exception is raised, any
    other value returned. Calls are recorded as (kind, args, kwargs)."""

    conditional = True

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def _next(self, kind: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((kind, args, kwargs))
        item = self.script.pop(0) if self.script else None
        if isinstance(item, BaseException):
            raise item
        return item

    def get_range(self, key, start, end):  # type: ignore[no-untyped-def]
        return self._next("get_range", key, start, end)

    def head(self, key):  # type: ignore[no-untyped-def]
        return self._next("head", key)

    def put_file(self, key, path):  # type: ignore[no-untyped-def]
        return self._next("put_file", key, path)

    def put_bytes(self, key, data, **kwargs):  # type: ignore[no-untyped-def]
        return self._next("put_bytes", key, data, **kwargs)

    def delete(self, key):  # type: ignore[no-untyped-def]
        return self._next("delete", key)


class Clock:
    """``time`` for the store module: monotonic time moves only when the store sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Jitter:
    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def _store(transport: Any, monkeypatch: pytest.MonkeyPatch, *jitter: float, **changes: Any) -> tuple[Store, Clock]:
    clock = Clock()
    monkeypatch.setattr(store_module, "time", clock)
    settings = dict(retries=5, backoff_s=1.0, deadline_s=1000.0)
    settings.update(changes)
    store = Store(URL, RemoteOptions(**settings), transport=transport)
    store._jitter = Jitter(*(jitter or (0.5,)))  # type: ignore[assignment]
    return store, clock


def _reset(n: int = 1) -> list[BaseException]:
    return [ConnectionResetError(errno.ECONNRESET, "reset") for _ in range(n)]


# --- attempts, pauses, the deadline ---------------------------------------------------------------


def test_pauses_double_up_to_five_seconds_scaled_by_the_jitter(monkeypatch):
    transport = Scripted(*_reset(6))
    store, clock = _store(transport, monkeypatch, 0.0, 1.0, 0.5, 0.25, 0.5, retries=6)
    with pytest.raises(RemoteStoreError) as caught:
        store.read_range("shards/a.pks", 0, 4)
    # pauses 1, 2, 4, 8 -> 5 (the cap), 16 -> 5, each times 0.5 + jitter
    assert clock.sleeps == [0.5, 3.0, 4.0, 3.75, 5.0]
    assert store.requests == 6 and store.retried == 5
    assert caught.value.message == ("range GET shards/a.pks bytes 0-4 failed after 6 attempts in 16.2 s: "
                                    "ConnectionResetError: [Errno 104] reset")
    assert caught.value.path == "s3://bucket/ds"
    assert not hasattr(caught.value, "verdict")
    assert transport.calls == [("get_range", ("ds/shards/a.pks", 0, 4), {})] * 6


def test_the_first_pause_is_backoff_s(monkeypatch):
    store, clock = _store(Scripted(*_reset(1), b"abcd"), monkeypatch, 0.5, backoff_s=0.25)
    assert bytes(store.read_range("a", 0, 4)) == b"abcd"
    assert clock.sleeps == [0.25]
    assert (store.requests, store.retried, store.bytes_read) == (2, 1, 4)


def test_the_deadline_counts_the_pause_it_would_take(monkeypatch):
    store, clock = _store(Scripted(*_reset(9)), monkeypatch, 0.5, deadline_s=3.0, retries=9)
    with pytest.raises(RemoteStoreError) as caught:
        store.read_range("a", 0, 4)
    assert clock.sleeps == [1.0, 2.0]  # at 3 s, a pause of 4 would pass the deadline
    assert caught.value.message.startswith("range GET a bytes 0-4 failed after 3 attempts in 3.0 s: ")
    store, clock = _store(Scripted(*_reset(9)), monkeypatch, 0.5, deadline_s=2.9, retries=9)
    with pytest.raises(RemoteStoreError) as caught:
        store.read_range("a", 0, 4)
    assert clock.sleeps == [1.0]
    assert "failed after 2 attempts in 1.0 s" in caught.value.message


def test_one_attempt_is_named_in_the_singular(monkeypatch):
    store, clock = _store(Scripted(TimeoutError("slow")), monkeypatch, retries=1)
    with pytest.raises(RemoteStoreError) as caught:
        store.read_range("a", 2, 9, what="shard a")
    assert caught.value.message == "range GET shard a bytes 2-9 failed after 1 attempt in 0.0 s: TimeoutError: slow"
    assert clock.sleeps == [] and store.retried == 0


@pytest.mark.parametrize("error, verdict, reason", [
    (FileNotFoundError("no such key"), MISSING, "not retried: the object does not exist"),
    (_NoRange("the server ignores ranges"), NO_RANGE, "not retried: packer reads datasets from servers that answer "
                                                      "Range requests with 206 Partial Content; copy the dataset "
                                                      "to a bucket or a local folder"),
    (PermissionError("denied"), DENIED, "not retried: the store refused access; check the credentials and the "
                                        "bucket's permissions"),
    (ValueError("bad argument"), FINAL, "not retried: the store answered that it cannot be done as asked"),
    (_HttpStatus(412, "Precondition Failed"), PRECONDITION, "not retried: the store answered that it cannot be done "
                                                            "as asked"),
    (_HttpStatus(416, "Range Not Satisfiable"), UNSATISFIABLE, "not retried: the store answered that it cannot be "
                                                               "done as asked"),
])
def test_a_final_verdict_is_one_attempt_and_names_why(monkeypatch, error, verdict, reason):
    store, clock = _store(Scripted(error), monkeypatch)
    with pytest.raises(RemoteStoreError) as caught:
        store.read_range("shards/a.pks", 0, 4)
    assert caught.value.message == f"range GET shards/a.pks bytes 0-4 failed: {_first_line(error)} ({reason})"
    assert caught.value.verdict == verdict
    assert caught.value.path == "s3://bucket/ds"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert (store.requests, store.retried, clock.sleeps) == (1, 0, [])


@pytest.mark.parametrize("error", [OptionError("packer's own"), TypeError("a bug"), AttributeError("a bug"),
                                   NameError("a bug")])
def test_packers_own_errors_and_programming_errors_pass_through_unretried(monkeypatch, error):
    store, clock = _store(Scripted(error, b"abcd"), monkeypatch)
    with pytest.raises(type(error)) as caught:
        store.read_range("a", 0, 4)
    assert caught.value is error
    assert (store.requests, clock.sleeps) == (1, [])


def test_a_short_body_is_retried_and_a_long_one_is_final(monkeypatch):
    store, clock = _store(Scripted(b"ab", b"abcd"), monkeypatch)
    assert bytes(store.read_range("a", 10, 14)) == b"abcd"
    assert (store.requests, store.retried, store.bytes_read) == (2, 1, 4)
    store, clock = _store(Scripted(b"abcde"), monkeypatch)
    with pytest.raises(RemoteStoreError) as caught:
        store.read_range("a", 10, 14)
    assert caught.value.verdict == NO_RANGE
    assert caught.value.message.startswith("range GET a bytes 10-14 failed: the store sent 5 bytes for a range of 4 "
                                           "(not retried: packer reads datasets from servers")
    store, clock = _store(Scripted(b"ab", b"ab"), monkeypatch, retries=2)
    with pytest.raises(RemoteStoreError) as caught:
        store.read_range("a", 10, 14)
    assert caught.value.message.endswith("failed after 2 attempts in 1.0 s: _Truncated: got 2 of 4 bytes")


def test_bytes_read_counts_what_came_back(monkeypatch):
    store, _ = _store(Scripted(b"abcd", b"xyz", None), monkeypatch)
    store.read_range("a", 0, 4)
    assert store.read_prefix("b", 10) == b"xyz"
    assert store.bytes_read == 7
    store.put_file("c", "/nowhere")
    assert store.bytes_read == 7 and store.requests == 3


# --- the methods' verdicts ------------------------------------------------------------------------


def test_read_prefix_asks_one_byte_past_the_limit(monkeypatch):
    transport = Scripted(bytearray(b"abc"))
    store, _ = _store(transport, monkeypatch)
    data = store.read_prefix("manifest.json", 64)
    assert data == b"abc" and type(data) is bytes
    assert transport.calls == [("get_range", ("ds/manifest.json", 0, 65), {})]


def test_read_prefix_of_an_empty_or_missing_object(monkeypatch):
    store, _ = _store(Scripted(_HttpStatus(416, "Range Not Satisfiable")), monkeypatch)
    assert store.read_prefix("a", 10) == b""
    store, _ = _store(Scripted(FileNotFoundError("gone")), monkeypatch)
    assert store.read_prefix("a", 10, missing_ok=True) is None
    store, _ = _store(Scripted(FileNotFoundError("gone")), monkeypatch)
    with pytest.raises(RemoteStoreError) as caught:
        store.read_prefix("a", 10)
    assert caught.value.message == "GET a failed: gone (not retried: the object does not exist)"
    store, _ = _store(Scripted(PermissionError("no")), monkeypatch)
    with pytest.raises(RemoteStoreError) as caught:
        store.read_prefix("a", 10, missing_ok=True)
    assert caught.value.verdict == DENIED
    store, _ = _store(Scripted(*_reset(2)), monkeypatch, retries=2)
    with pytest.raises(RemoteStoreError, match="GET a failed after 2 attempts"):
        store.read_prefix("a", 10, missing_ok=True)


def test_head_answers_none_for_a_missing_or_refused_object(monkeypatch):
    info = ObjectInfo(size=3, etag='"e"')
    transport = Scripted(info, FileNotFoundError("gone"), PermissionError("no"), ValueError("bad"))
    store, _ = _store(transport, monkeypatch)
    assert store.head("a") is info
    assert store.head("b") is None
    assert store.head("c") is None
    with pytest.raises(RemoteStoreError) as caught:
        store.head("d")
    assert caught.value.message == "HEAD d failed: bad (not retried: the store answered that it cannot be done as asked)"
    assert [call[1] for call in transport.calls] == [("ds/a",), ("ds/b",), ("ds/c",), ("ds/d",)]
    assert store.bytes_read == 0


def test_put_bytes_passes_only_the_condition_asked(monkeypatch):
    info = ObjectInfo(size=3, etag='"e"')
    transport = Scripted()
    store, _ = _store(transport, monkeypatch)
    store.put_bytes("m", b"1")
    store.put_bytes("m", b"2", if_absent=True)
    store.put_bytes("m", b"3", if_match=info)
    store.put_bytes("m", b"4", if_match=None, if_absent=False)
    store.put_file("f", "/tmp/x")
    assert transport.calls == [("put_bytes", ("ds/m", b"1"), {}), ("put_bytes", ("ds/m", b"2"), {"if_absent": True}),
                               ("put_bytes", ("ds/m", b"3"), {"if_match": info}), ("put_bytes", ("ds/m", b"4"), {}),
                               ("put_file", ("ds/f", "/tmp/x"), {})]


def test_a_failed_precondition_is_its_own_error_only_when_one_was_asked(monkeypatch):
    info = ObjectInfo(size=3, etag='"e"')
    for condition in ({"if_absent": True}, {"if_match": info}):
        store, _ = _store(Scripted(_HttpStatus(412, "Precondition Failed")), monkeypatch)
        with pytest.raises(PreconditionFailed) as caught:
            store.put_bytes("manifest.json", b"x", **condition)
        assert caught.value.message == ("upload manifest.json: the object changed since it was read (its precondition "
                                        "failed): another writer got there first")
        assert caught.value.path == "s3://bucket/ds"
        assert caught.value.__cause__ is None and caught.value.__suppress_context__
    store, _ = _store(Scripted(_HttpStatus(412, "Precondition Failed")), monkeypatch)
    with pytest.raises(RemoteStoreError) as caught:
        store.put_bytes("manifest.json", b"x")
    assert type(caught.value) is RemoteStoreError and caught.value.verdict == PRECONDITION
    store, _ = _store(Scripted(PermissionError("no")), monkeypatch)
    with pytest.raises(RemoteStoreError) as caught:
        store.put_bytes("manifest.json", b"x", if_absent=True)
    assert type(caught.value) is RemoteStoreError
    assert caught.value.message.startswith("upload manifest.json failed: no (not retried: the store refused")


def test_delete_of_a_missing_object_is_done(monkeypatch):
    transport = Scripted(None, FileNotFoundError("gone"), PermissionError("no"))
    store, _ = _store(transport, monkeypatch)
    store.delete("a")
    store.delete("b")
    with pytest.raises(RemoteStoreError) as caught:
        store.delete("c")
    assert caught.value.message.startswith("DELETE c failed: no (not retried: the store refused access")
    store, _ = _store(Scripted(*_reset(2)), monkeypatch, retries=2)
    with pytest.raises(RemoteStoreError, match="DELETE d failed after 2 attempts"):
        store.delete("d")
    assert [call[:2] for call in transport.calls] == [("delete", ("ds/a",)), ("delete", ("ds/b",)),
                                                      ("delete", ("ds/c",))]


def test_conditional_is_the_transports_say(monkeypatch):
    transport = Scripted()
    store, _ = _store(transport, monkeypatch)
    assert store.conditional is True
    transport.conditional = 0  # type: ignore[assignment]
    assert store.conditional is False
    plain = types.SimpleNamespace()
    assert Store(URL, RemoteOptions(), transport=plain).conditional is False  # type: ignore[arg-type]
    assert store.key("shards/a.pks") == "ds/shards/a.pks"


def test_first_line_of_an_error():
    assert _first_line(ValueError("one\ntwo")) == "one"
    assert _first_line(ValueError("  padded  ")) == "padded"
    assert _first_line(ValueError("")) == "ValueError"
    assert _first_line(ValueError("x" * 400)) == "x" * 300
    assert _first_line(ValueError("at http://k:s@127.0.0.1/b?sig=1 now")) == "at http://<redacted>@127.0.0.1/b?<redacted> now"


# --- one client per process and store -------------------------------------------------------------


class _Made:
    conditional = False

    def __init__(self, url: Any, options: RemoteOptions) -> None:
        self.url, self.options = url, options


def test_store_for_shares_a_client_per_store_and_settings(monkeypatch):
    monkeypatch.setattr(store_module, "_STORES", {})
    monkeypatch.setattr(store_module, "FsspecTransport", type("FakeFsspec", (_Made,), {}))
    monkeypatch.setattr(store_module, "ObstoreTransport", type("FakeObstore", (_Made,), {}))
    base = RemoteOptions(endpoint_url="http://127.0.0.1:9", region="r", storage_options={"a": 1})
    first = store_for(URL, base)
    assert type(first.transport).__name__ == "FakeFsspec" and first.transport.options is base
    assert store_for(URL, base) is first
    assert store_for(parse_url("s3://bucket/ds/"), base.with_(cache_dir="/elsewhere", in_flight=1,
                                                              extent_bytes=1, cache_bytes=5)) is first
    assert store_for(URL, base.with_(storage_options={"a": 1})) is first
    others = [store_for(parse_url("gs://bucket/ds"), base), store_for(parse_url("s3://other/ds"), base),
              store_for(parse_url("s3://bucket/ds2"), base), store_for(URL, base.with_(transport="obstore")),
              store_for(URL, base.with_(endpoint_url="http://127.0.0.1:10")), store_for(URL, base.with_(region="q")),
              store_for(URL, base.with_(storage_options={"a": 2})), store_for(URL, base.with_(storage_options={"b": 1})),
              store_for(URL, base.with_(retries=2)), store_for(URL, base.with_(deadline_s=9.0)),
              store_for(URL, base.with_(timeout_s=9.0)), store_for(URL, base.with_(backoff_s=9.0))]
    assert len({id(store) for store in [first] + others}) == 1 + len(others)
    assert type(others[3].transport).__name__ == "FakeObstore"
    monkeypatch.setattr(store_module.os, "getpid", lambda: -5)
    assert store_for(URL, base) is not first  # another process makes its own


def test_a_forked_child_forgets_its_parents_clients(monkeypatch):
    monkeypatch.setattr(store_module, "FsspecTransport", _Made)
    table: dict = {}
    monkeypatch.setattr(store_module, "_STORES", table)
    first = store_for(URL, RemoteOptions())
    lock = store_module._STORES_LOCK
    store_module._forget_stores()
    assert table == {} and store_module._STORES_LOCK is not lock
    assert store_for(URL, RemoteOptions()) is not first


# --- classification details -----------------------------------------------------------------------


class _ClientError(Exception):
    def __init__(self, code: Any = None, status: Any = None, error: Any = None) -> None:
        super().__init__(f"{code} {status}")
        metadata = {} if status is None else {"HTTPStatusCode": status}
        self.response = {"Error": {"Code": code} if error is None else error, "ResponseMetadata": metadata}


@pytest.mark.parametrize("code, status, verdict", [
    ("PreconditionFailed", None, PRECONDITION), ("ConditionalRequestConflict", None, PRECONDITION),
    ("NoSuchKey", None, MISSING), ("NoSuchBucket", None, MISSING), ("NotFound", None, MISSING), ("404", None, MISSING),
    ("AccessDenied", None, DENIED), ("403", None, DENIED), ("InvalidAccessKeyId", None, DENIED),
    ("SignatureDoesNotMatch", None, DENIED), ("ExpiredToken", None, DENIED), ("InvalidRange", None, UNSATISFIABLE),
    ("SlowDown", None, RETRY), ("ServiceUnavailable", None, RETRY), ("InternalError", None, RETRY),
    ("RequestTimeout", None, RETRY), ("TooManyRequests", None, RETRY), ("Throttling", None, RETRY),
    ("ThrottlingException", None, RETRY), ("Whatever", 503, RETRY), ("Whatever", 404, MISSING),
    ("Whatever", "503", FINAL), ("500", None, RETRY), ("412", None, PRECONDITION), ("Whatever", None, FINAL),
    (None, None, FINAL),
])
def test_an_s3_error_answer_goes_by_its_code_then_its_status(code, status, verdict):
    assert classify(_ClientError(code, status)) == verdict


def test_an_error_answer_is_found_down_the_cause_chain_five_deep():
    def wrapped(depth: int, how: str) -> BaseException:
        error: BaseException = _ClientError("AccessDenied")
        for _ in range(depth):
            outer = RuntimeError("wrapper")
            setattr(outer, how, error)
            error = outer
        return error

    assert classify(wrapped(4, "__cause__")) == DENIED
    assert classify(wrapped(4, "__context__")) == DENIED
    assert classify(wrapped(5, "__cause__")) == RETRY  # deeper than five: a RuntimeError, retried
    plain = RuntimeError("x")
    plain.response = {"Error": "not a dict"}  # type: ignore[attr-defined]
    assert classify(plain) == RETRY
    plain.response = ["Error"]  # type: ignore[attr-defined]
    assert classify(plain) == RETRY


@pytest.mark.parametrize("error, verdict", [
    (_Oversize("long"), NO_RANGE), (_NoRange("whole"), NO_RANGE), (_Timeout("slow"), RETRY),
    (__import__("asyncio").TimeoutError(), RETRY), (ConnectionError("gone"), RETRY), (KeyError("k"), FINAL),
    (NotImplementedError("no"), FINAL), (OSError("no errno"), RETRY), (OSError(errno.EDOM, "unknown errno"), RETRY),
    (OSError(errno.EAGAIN, "again"), RETRY), (OSError(errno.ETIMEDOUT, "t"), RETRY),
    (OSError(errno.ECONNABORTED, "a"), RETRY), (OSError(errno.ECONNREFUSED, "r"), RETRY),
    (OSError(errno.ENETUNREACH, "n"), RETRY), (OSError(errno.EHOSTUNREACH, "h"), RETRY),
    (OSError(errno.EREMOTEIO, "r"), RETRY),
    # OSError(EPERM or EACCES, ...) is made a PermissionError by Python itself: denied, before the errno table
    (OSError(errno.EPERM, "p"), DENIED), (OSError(errno.EACCES, "a"), DENIED),
    (OSError(errno.ENAMETOOLONG, "n"), FINAL), (OSError(errno.ENOTEMPTY, "n"), FINAL), (OSError(errno.EROFS, "r"), FINAL),
])
def test_packers_own_and_errno_errors(error, verdict):
    assert classify(error) == verdict


def _named(module: str, name: str, base: type = Exception) -> type:
    return type(name, (base,), {"__module__": module})


def test_a_class_is_looked_up_along_its_ancestors_by_package_and_name():
    base = _named("botocore.exceptions", "HTTPClientError")
    child = type("SomethingNew", (base,), {"__module__": "botocore.exceptions"})
    assert classify(child("x")) == RETRY
    assert classify(_named("elsewhere.errors", "HTTPClientError", ValueError)("x")) == FINAL  # another package
    assert classify(_named("botocore.exceptions", "BotoCoreError", ConnectionError)("x")) == FINAL
    assert classify(_named("aiohttp.client_exceptions", "ClientError")("x")) == RETRY
    assert classify(_named("fsspec.exceptions", "FSTimeoutError", ValueError)("x")) == RETRY
    assert classify(_named("urllib3.exceptions", "ProtocolError", ValueError)("x")) == RETRY


def test_an_obstore_error_goes_by_the_status_in_its_text():
    generic = _named("obstore.exceptions", "GenericError")
    assert classify(generic("Server returned non-2xx status code: 404 Not Found")) == MISSING
    assert classify(generic("status code 403")) == DENIED
    assert classify(generic("HTTP/1.1 429 Too Many Requests")) == RETRY
    assert classify(generic("HTTP 501")) == FINAL
    assert classify(generic("HTTP/2 412")) == RETRY  # not a status spelling the rule reads
    assert classify(generic("status code: 5034")) == RETRY
    denied = _named("obstore.exceptions", "PermissionDeniedError")
    assert classify(denied("status code 503")) == DENIED  # only a retried class looks at its text
    unsupported = _named("obstore.exceptions", "NotSupportedError")
    assert classify(unsupported("Range request not supported")) == NO_RANGE
    assert classify(unsupported("range request not supported")) == FINAL
    assert classify(_named("other", "NotSupportedError", ValueError)("Range")) == FINAL


def test_an_aiohttp_response_error_goes_by_its_status():
    response = _named("aiohttp.client_exceptions", "ClientResponseError")
    _named_error = response("x")
    _named_error.status = 0
    response_table = store_module._BY_CLASS
    assert ("aiohttp", "ClientResponseError") not in response_table
    assert classify(_named_error) == RETRY  # no status: an unknown class of a known package, retried
    client = _named("aiohttp.client_exceptions", "ClientError")
    error = client("x")
    error.status = 404
    assert classify(error) == MISSING
    error.status = "404"
    assert classify(error) == RETRY
    error.status = 0
    assert classify(error) == RETRY


# --- the fsspec transport over stand-ins -----------------------------------------------------------


def test_the_fsspec_s3_client_gets_packers_retries_and_timeouts(monkeypatch):
    fake = fake_fsspec_store(monkeypatch, "s3", "s3fs", "S3FileSystem")
    options = RemoteOptions(endpoint_url="http://127.0.0.1:9", region="eu-west-1", timeout_s=7.0,
                            storage_options={"requester_pays": True})
    transport = FsspecTransport(parse_url("s3://bucket/ds"), options)
    assert fake.made[-1] == {"requester_pays": True,
                             "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"},
                                               "connect_timeout": 7.0, "read_timeout": 7.0},
                             "endpoint_url": "http://127.0.0.1:9", "client_kwargs": {"region_name": "eu-west-1"}}
    assert transport.fs.retries == 1
    assert (transport.protocol, transport.timeout, transport.conditional) == ("s3", 7.0, True)
    assert transport._path("ds/a") == "bucket/ds/a"
    FsspecTransport(parse_url("s3://bucket/ds"), RemoteOptions())
    assert "endpoint_url" not in fake.made[-1] and "client_kwargs" not in fake.made[-1]


def test_the_fsspec_s3_transport_writes_conditions_through_put_object(monkeypatch):
    fake = fake_fsspec_store(monkeypatch, "s3", "s3fs", "S3FileSystem")
    calls: list[tuple[Any, ...]] = []
    fake.call_s3 = lambda self, method, **kwargs: calls.append((method, kwargs))
    transport = FsspecTransport(parse_url("s3://bucket/ds"), RemoteOptions())
    transport.put_bytes("ds/manifest.json", b"new", if_absent=True)
    transport.put_bytes("ds/manifest.json", b"newer", if_match=ObjectInfo(size=3, etag='"e1"'))
    assert calls == [("put_object", {"Bucket": "bucket", "Key": "ds/manifest.json", "Body": b"new",
                                     "IfNoneMatch": "*"}),
                     ("put_object", {"Bucket": "bucket", "Key": "ds/manifest.json", "Body": b"newer",
                                     "IfMatch": '"e1"'})]
    transport.put_bytes("ds/plain", b"p")
    assert transport.fs.cat_file("bucket/ds/plain") == b"p" and len(calls) == 2


def test_the_fsspec_transport_reads_writes_and_deletes_through_the_filesystem(monkeypatch, tmp_path):
    fake = fake_fsspec_store(monkeypatch, "gcs", "gcsfs", "GCSFileSystem")
    transport = FsspecTransport(parse_url("gs://bucket/ds"), RemoteOptions(storage_options={"project": "p"}))
    assert fake.made[-1] == {"project": "p"}
    assert transport.conditional is False and transport.protocol == "gcs"
    (tmp_path / "f").write_bytes(b"0123456789")
    transport.put_file("ds/f", str(tmp_path / "f"))
    assert transport.get_range("ds/f", 2, 5) == b"234"
    assert transport.get_range("ds/f", 5, 5) == b"" and transport.get_range("ds/f", 6, 5) == b""
    info = transport.head("ds/f")
    assert (info.size, info.etag, info.version) == (10, None, None)
    transport.put_bytes("ds/g", b"abc")
    assert transport.get_range("ds/g", 0, 10) == b"abc"
    with pytest.raises(OptionError) as caught:
        transport.put_bytes("ds/g", b"abc", if_absent=True)
    assert caught.value.message == "the fsspec gcs transport has no conditional write"
    with pytest.raises(OptionError):
        transport.put_bytes("ds/g", b"abc", if_match=ObjectInfo(size=3, etag="e"))
    transport.delete("ds/g")
    with pytest.raises(FileNotFoundError):
        transport.head("ds/g")
    assert "/bucket/ds/f" in fake.store


def test_the_fsspec_head_reads_etag_and_generation(monkeypatch):
    fake_fsspec_store(monkeypatch, "gcs", "gcsfs", "GCSFileSystem")
    transport = FsspecTransport(parse_url("gs://bucket/ds"), RemoteOptions())
    for info, expected in (({"size": "5", "ETag": '"a"'}, (5, '"a"', None)), ({"size": 5, "etag": "b"}, (5, "b", None)),
                           ({"size": 5, "ETag": "", "etag": "c", "generation": 17}, (5, "c", "17")),
                           ({"size": 5, "generation": 0}, (5, None, None))):
        transport.fs.info = lambda path, info=info: info
        head = transport.head("k")
        assert (head.size, head.etag, head.version) == expected


class _SlowAsyncFS:
    async_impl = True

    def __init__(self, delay: float) -> None:
        import fsspec.asyn

        self.loop = fsspec.asyn.get_loop()
        self.delay = delay

    async def _cat_file(self, path, start=None, end=None):  # type: ignore[no-untyped-def]
        import asyncio

        await asyncio.sleep(self.delay)
        return f"{path}:{start}:{end}".encode()

    def cat_file(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("an async filesystem is called through its coroutine")


def _async_transport(delay: float, timeout: float) -> FsspecTransport:
    transport = FsspecTransport.__new__(FsspecTransport)
    transport.fs, transport.protocol, transport.timeout, transport._root, transport.conditional = (
        _SlowAsyncFS(delay), "s3", timeout, "bucket", True)
    return transport


def test_an_async_filesystem_runs_under_the_whole_request_timeout():
    assert _async_transport(0.0, 5.0).get_range("ds/a", 3, 9) == b"bucket/ds/a:3:9"
    with pytest.raises(_Timeout) as caught:
        _async_transport(2.0, 0.05).get_range("ds/a", 0, 4)
    assert str(caught.value) == "no complete answer within timeout_s=0.05 s (body included)"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# --- the fsspec HTTP transport against a web server on 127.0.0.1 -----------------------------------


class _RangeServer(BaseHTTPRequestHandler):
    """Serves ``objects`` honouring Range (206), or as configured: a status, or the whole object."""

    objects: dict[str, bytes] = {}
    status: dict[str, int] = {}
    whole: set[str] = set()
    seen: list[tuple[str, str | None]] = []

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        path, _, query = self.path.partition("?")
        self.seen.append((path, self.headers.get("Range")))
        self.extra_seen.append((query, self.headers.get("X-Token")))
        self.path = path
        status = self.status.get(self.path)
        if status is not None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = self.objects[self.path]
        if self.path.endswith("late"):  # the range asked, then (a moment later) more than asked
            first, last = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
            self.send_response(206)
            self.send_header("Content-Length", str(last + 1 - first + 5))
            self.end_headers()
            self.wfile.write(data[first:last + 1])
            self.wfile.flush()
            import time as _time

            _time.sleep(0.2)
            self.wfile.write(b"EXTRA")
            return
        if self.path not in self.whole:
            first, last = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
            data = data[first:last + 1] + (b"EXTRA" if self.path.endswith("long") else b"")
            self.send_response(206)
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def range_server():
    handler = type("Handler", (_RangeServer,), {"objects": {}, "status": {}, "whole": set(), "seen": [],
                                               "extra_seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield check_loopback(f"http://127.0.0.1:{server.server_address[1]}"), handler
    finally:
        server.shutdown()
        server.server_close()


def test_http_ranges_and_their_refusals(range_server):
    base, handler = range_server
    handler.objects.update({"/ds/a": bytes(range(100)), "/ds/whole": b"0123456789", "/ds/long": bytes(range(100))})
    handler.whole.add("/ds/whole")
    handler.status.update({"/ds/gone": 404, "/ds/no": 403, "/ds/auth": 401, "/ds/empty": 416, "/ds/busy": 503,
                           "/ds/teapot": 418, "/ds/bad": 400})
    handler.objects["/ds/late"] = bytes(range(100))
    options = RemoteOptions(timeout_s=10.0, retries=2, backoff_s=0.001)
    url = parse_url(f"{base}/ds")
    transport = FsspecTransport(url, options)
    assert transport.conditional is False and transport.protocol == "http"
    assert transport.get_range("ds/a", 10, 14) == bytes(range(10, 14))
    assert handler.seen[-1] == ("/ds/a", "bytes=10-13")
    assert transport.get_range("ds/a", 4, 4) == b""
    assert transport.get_range("ds/whole", 0, 10) == b"0123456789"  # a 200 from byte 0 that fits the range
    with pytest.raises(_NoRange) as caught:
        transport.get_range("ds/whole", 0, 9)
    assert str(caught.value) == ("the server answered a range request (bytes 0-8) with HTTP 200 and the whole object, "
                                 "which is larger: it does not serve byte ranges")
    with pytest.raises(_NoRange) as caught:
        transport.get_range("ds/whole", 1, 10)
    assert str(caught.value) == ("the server answered a range request (bytes 1-9) with HTTP 200 and the whole object: "
                                 "it does not serve byte ranges")
    with pytest.raises(_Oversize) as caught:
        transport.get_range("ds/long", 0, 4)
    assert str(caught.value) == "the server sent more than the 4 bytes of the range asked"
    with pytest.raises(_Oversize):
        transport.get_range("ds/long", 10, 14)
    with pytest.raises(_Oversize):
        transport.get_range("ds/late", 10, 14)  # the extra bytes come after the range: still read, and refused
    with pytest.raises(FileNotFoundError, match=r"/ds/gone: HTTP 404 Not Found"):
        transport.get_range("ds/gone", 0, 4)
    with pytest.raises(PermissionError, match=r"/ds/no: HTTP 403 Forbidden"):
        transport.get_range("ds/no", 0, 4)
    with pytest.raises(PermissionError, match=r"/ds/auth: HTTP 401 Unauthorized"):
        transport.get_range("ds/auth", 0, 4)
    for key, status, text in (("ds/empty", 416, "HTTP 416 Range Not Satisfiable"),
                              ("ds/busy", 503, "HTTP 503 Service Unavailable"), ("ds/teapot", 418, "HTTP 418 I'm a Teapot"),
                              ("ds/bad", 400, "HTTP 400 Bad Request")):
        with pytest.raises(_HttpStatus) as caught:
            transport.get_range(key, 0, 4)
        assert caught.value.status == status and str(caught.value) == text
    store = Store(url, options, transport=transport)
    assert store.read_prefix("empty", 10) == b""
    assert store.read_prefix("gone", 10, missing_ok=True) is None
    with pytest.raises(RemoteStoreError, match="failed after 2 attempts"):
        store.read_prefix("busy", 10)


def test_a_large_http_body_is_read_whole_in_pieces(range_server):
    base, handler = range_server
    data = os.urandom(3 << 20)
    handler.objects["/ds/big"] = data
    handler.objects["/ds/bigwhole"] = data
    handler.whole.add("/ds/bigwhole")
    transport = FsspecTransport(parse_url(f"{base}/ds"), RemoteOptions(timeout_s=20.0))
    assert transport.get_range("ds/big", 5, len(data)) == data[5:]
    assert transport.get_range("ds/bigwhole", 0, len(data)) == data
    with pytest.raises(_NoRange):  # counted over every piece, not the last one
        transport.get_range("ds/bigwhole", 0, 2 << 20)


def test_http_requests_carry_the_clients_headers_and_options(range_server):
    base, handler = range_server
    handler.objects["/ds/a"] = bytes(range(100))
    options = RemoteOptions(timeout_s=10.0, storage_options={"headers": {"X-Token": "t1"}, "params": {"v": "2"}})
    transport = FsspecTransport(parse_url(f"{base}/ds"), options)
    assert transport.get_range("ds/a", 1, 3) == bytes([1, 2])
    assert handler.seen[-1] == ("/ds/a", "bytes=1-2")
    assert handler.extra_seen[-1] == ("v=2", "t1")
    assert transport.fs.kwargs["headers"] == {"X-Token": "t1"}  # the client's own headers are left as given


def test_an_http_status_names_itself():
    assert str(_HttpStatus(503, "Slow Down")) == "HTTP 503 Slow Down"
    assert _HttpStatus(503, "x").status == 503


# --- the obstore transport over a stand-in ---------------------------------------------------------


class _FakeObstoreModule(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("obstore")
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.range_error: BaseException | None = None
        self.chunks: list[bytes] = []
        self.meta: dict[str, Any] = {}

    def get_range(self, store, key, *, start, end):  # type: ignore[no-untyped-def]
        self.calls.append(("get_range", (key,), {"start": start, "end": end}))
        if self.range_error is not None:
            raise self.range_error
        return b"r" * (end - start)

    def get(self, store, key):  # type: ignore[no-untyped-def]
        self.calls.append(("get", (key,), {}))
        chunks = self.chunks

        class Result:
            def stream(self, min_chunk_size):  # type: ignore[no-untyped-def]
                assert min_chunk_size == 1 << 20
                yield from chunks
        return Result()

    def head(self, store, key):  # type: ignore[no-untyped-def]
        self.calls.append(("head", (store, key), {}))
        return self.meta

    def put(self, store, key, data, **kwargs):  # type: ignore[no-untyped-def]
        assert store == "client"
        self.calls.append(("put", (key, data if isinstance(data, bytes) else f"file {data.mode}"), kwargs))

    def delete(self, store, key):  # type: ignore[no-untyped-def]
        self.calls.append(("delete", (store, key), {}))


@pytest.fixture
def fake_obstore(monkeypatch):
    module = _FakeObstoreModule()
    made: list[tuple[Any, ...]] = []
    submodule = types.ModuleType("obstore.store")

    def from_url(root, **kwargs):  # type: ignore[no-untyped-def]
        made.append((root, kwargs))
        if module.meta.get("refuse"):
            raise ValueError("Configuration key: 'nope' is not valid\nmore")
        return "client"

    submodule.from_url = from_url  # type: ignore[attr-defined]
    module.store = submodule  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "obstore", module)
    monkeypatch.setitem(sys.modules, "obstore.store", submodule)
    monkeypatch.setattr(store_module, "_OBSTORE_PID", None)
    module.made = made  # type: ignore[attr-defined]
    return module


def test_the_obstore_client_gets_packers_timeouts_and_no_retries(fake_obstore):
    from datetime import timedelta

    options = RemoteOptions(endpoint_url="http://127.0.0.1:9", region="r", timeout_s=7.0, deadline_s=60.0,
                            storage_options={"aws_skip_signature": "true"})
    transport = ObstoreTransport(parse_url("s3://bucket/ds"), options)
    root, kwargs = fake_obstore.made[-1]
    assert root == "s3://bucket/"
    assert kwargs == {"config": {"endpoint": "http://127.0.0.1:9", "region": "r", "aws_skip_signature": "true"},
                      "client_options": {"timeout": "7.0s", "connect_timeout": "7.0s", "allow_http": True},
                      "retry_config": {"max_retries": 0, "retry_timeout": timedelta(seconds=60.0),
                                       "backoff": {"init_backoff": timedelta(milliseconds=10),
                                                   "max_backoff": timedelta(milliseconds=10), "base": 2}}}
    assert transport.conditional is True and transport.store == "client"
    assert store_module._OBSTORE_PID == os.getpid()
    ObstoreTransport(parse_url("gs://bucket/ds"), RemoteOptions(endpoint_url="https://127.0.0.1:9"))
    assert fake_obstore.made[-1][1]["client_options"]["allow_http"] is False
    plain = ObstoreTransport(parse_url("http://127.0.0.1:8/ds"), RemoteOptions())
    root, kwargs = fake_obstore.made[-1]
    assert root == "http://127.0.0.1:8/" and kwargs["config"] is None
    assert kwargs["client_options"] == {"timeout": "30.0s", "connect_timeout": "30.0s", "allow_http": True}
    assert plain.conditional is False
    assert ObstoreTransport(parse_url("https://h/ds"), RemoteOptions()).conditional is False
    assert "allow_http" not in fake_obstore.made[-1][1]["client_options"]
    assert ObstoreTransport(parse_url("az://c/ds"), RemoteOptions()).conditional is True


def test_an_obstore_configuration_error_names_the_setting(fake_obstore):
    fake_obstore.meta["refuse"] = True
    with pytest.raises(OptionError) as caught:
        ObstoreTransport(parse_url("az://c/ds"), RemoteOptions())
    assert caught.value.message == ("cannot make an obstore client for az://c/ds: Configuration key: 'nope' is not "
                                    "valid (give the store's settings in RemoteOptions.storage_options or its "
                                    "environment variables, e.g. AZURE_STORAGE_ACCOUNT_NAME)")
    assert caught.value.path == "az://c/ds"


def test_obstore_is_refused_in_a_process_forked_after_its_use(fake_obstore, monkeypatch):
    monkeypatch.setattr(store_module, "_OBSTORE_PID", os.getpid() + 1)
    with pytest.raises(RemoteStoreError) as caught:
        ObstoreTransport(parse_url("s3://bucket/ds"), RemoteOptions())
    assert caught.value.message.startswith("transport='obstore' cannot run in a process forked from one that already "
                                           "used it (its tokio runtime does not survive fork")
    assert caught.value.path == "s3://bucket/ds"
    assert fake_obstore.made == []
    monkeypatch.setattr(store_module, "_OBSTORE_PID", os.getpid())
    ObstoreTransport(parse_url("s3://bucket/ds"), RemoteOptions())  # the same process may make more


def test_obstore_reads_ranges_and_falls_back_to_a_bounded_whole_read(fake_obstore):
    transport = ObstoreTransport(parse_url("s3://bucket/ds"), RemoteOptions())
    assert transport.get_range("ds/a", 2, 5) == b"rrr"
    assert transport.get_range("ds/a", 5, 5) == b"" and transport.get_range("ds/a", 6, 5) == b""
    assert fake_obstore.calls == [("get_range", ("ds/a",), {"start": 2, "end": 5})]
    unsupported = _named("obstore.exceptions", "NotSupportedError")
    fake_obstore.range_error = unsupported("Range request not supported")
    fake_obstore.chunks = [b"ab", b"cd"]
    assert transport.get_range("ds/a", 0, 4) == b"abcd"
    assert fake_obstore.calls[-1] == ("get", ("ds/a",), {})
    with pytest.raises(_NoRange) as caught:
        transport.get_range("ds/a", 0, 3)
    assert str(caught.value) == ("the server does not serve byte ranges and the object is larger than the 3 bytes "
                                 "asked")
    with pytest.raises(unsupported):
        transport.get_range("ds/a", 1, 4)  # a whole object is never read for a range past byte 0
    fake_obstore.range_error = _named("obstore.exceptions", "NotFoundError")("gone")
    with pytest.raises(Exception, match="gone"):
        transport.get_range("ds/a", 0, 4)


def test_obstore_head_put_and_delete(fake_obstore, tmp_path):
    transport = ObstoreTransport(parse_url("s3://bucket/ds"), RemoteOptions())
    fake_obstore.meta = {"size": "12", "e_tag": '"t"', "version": 7}
    info = transport.head("ds/a")
    assert (info.size, info.etag, info.version) == (12, '"t"', "7")
    assert fake_obstore.calls.pop() == ("head", ("client", "ds/a"), {})
    fake_obstore.meta = {"size": 3, "version": None}
    info = transport.head("ds/a")
    assert (info.size, info.etag, info.version) == (3, None, None)
    transport.put_bytes("ds/m", b"1")
    transport.put_bytes("ds/m", b"2", if_absent=True)
    transport.put_bytes("ds/m", b"3", if_match=ObjectInfo(size=1, etag='"e"', version="9"))
    transport.put_bytes("ds/m", b"4", if_match=ObjectInfo(size=1, etag=None, version="9"))
    transport.put_bytes("ds/m", b"5", if_match=ObjectInfo(size=1, etag='"e"'), if_absent=True)
    fake_obstore.calls = [call for call in fake_obstore.calls if call[0] == "put"]
    assert [call[2]["mode"] for call in fake_obstore.calls] == [None, "create", {"e_tag": '"e"', "version": "9"},
                                                                 {"version": "9"}, "create"]
    assert [call[1] for call in fake_obstore.calls] == [("ds/m", b"1"), ("ds/m", b"2"), ("ds/m", b"3"),
                                                        ("ds/m", b"4"), ("ds/m", b"5")]
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(b"x" * (8 << 20))
    large.write_bytes(b"x" * ((8 << 20) + 1))
    transport.put_file("ds/s", str(small))
    transport.put_file("ds/l", str(large))
    assert fake_obstore.calls[-2:] == [
        ("put", ("ds/s", "file rb"), {"use_multipart": False, "chunk_size": 8 << 20, "max_concurrency": 8}),
        ("put", ("ds/l", "file rb"), {"use_multipart": True, "chunk_size": 8 << 20, "max_concurrency": 8})]
    transport.delete("ds/m")
    assert fake_obstore.calls[-1] == ("delete", ("client", "ds/m"), {})


def test_a_missing_transport_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "obstore", None)
    monkeypatch.setattr(store_module, "_OBSTORE_PID", None)
    with pytest.raises(PackerError) as caught:
        ObstoreTransport(parse_url("gs://bucket/ds"), RemoteOptions())
    assert caught.value.message.startswith("reading datasets in object storage needs obstore (")
    assert caught.value.message.endswith("install it with pip install 'packer-shards[gcs]' (or [remote]: every store)")
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(PackerError) as caught:
        FsspecTransport(parse_url("az://c/ds"), RemoteOptions())
    assert caught.value.message.endswith("pip install 'packer-shards[azure]' (or [remote]: every store)")
    assert store_module._missing("x", ValueError("v"), "file").message.endswith("'packer-shards[remote]' (or [remote]: "
                                                                                 "every store)")

