"""Fixtures of the object-storage tests: a real S3 server (moto) on 127.0.0.1 behind a seeded fault
proxy (``scripts/loopback_s3.py``), buckets, datasets uploaded there, and a guard that fails any
connection to an address outside the loopback range while these tests run."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest

pytest.importorskip("s3fs", reason="the [remote] extra is not installed")
pytest.importorskip("moto", reason="moto[server] (the dev extra) is not installed")

from helpers import write_images  # noqa: E402

from packer.remote import RemoteOptions  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "loopback_s3.py"
_GUARD = {"on": False}


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _audit(event: str, args: tuple[Any, ...]) -> None:
    # Every socket connection of this process (and of its forked DataLoader workers) while a remote
    # test runs must go to the loopback range: a test that would reach any other address fails.
    if _GUARD["on"] and event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and address and isinstance(address[0], str) and not _loopback(address[0]):
            raise ConnectionRefusedError(f"a remote test tried to connect to {address!r}: only 127.0.0.0/8 is allowed")


sys.addaudithook(_audit)


def check_loopback(url: str) -> str:
    """``url`` if its host is on the loopback range (every endpoint a test uses passes here)."""
    host = urlsplit(url).hostname or ""
    if not _loopback(host):
        raise AssertionError(f"test endpoint {url} is not on 127.0.0.0/8")
    return url


class LoopbackS3:
    """The running server: the proxy endpoint (what packer uses), moto's own, and the proxy's controls."""

    def __init__(self, proxy: str, direct: str) -> None:
        self.proxy = check_loopback(proxy)
        self.direct = check_loopback(direct)

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.proxy + path, data=data, method="POST" if data is not None else "GET")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def configure(self, **settings: Any) -> None:
        self._call("/__proxy__/config", settings)

    def reset(self) -> None:
        self._call("/__proxy__/reset", {})

    def log(self) -> list[dict[str, Any]]:
        return self._call("/__proxy__/log")

    def create_bucket(self, name: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.direct, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=name)


@pytest.fixture(scope="session")
def loopback_s3() -> Iterator[LoopbackS3]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    process = subprocess.Popen([sys.executable, str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=env)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the loopback S3 server did not start")
        endpoints = json.loads(line)
        yield LoopbackS3(endpoints["proxy"], endpoints["direct"])
    finally:
        process.stdin.close()  # type: ignore[union-attr]
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Dummy credentials (never a real chain), no instance-metadata lookups, and the connect guard."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_", "AZURE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    _GUARD["on"] = True
    try:
        yield
    finally:
        _GUARD["on"] = False


@pytest.fixture
def s3(loopback_s3: LoopbackS3, request: pytest.FixtureRequest) -> Iterator[LoopbackS3]:
    """The server with a clean proxy (no faults, no latency) and a fresh bucket named ``s3.bucket``."""
    import zlib

    loopback_s3.configure(fault_rate=0.0, latency_s=0.0, bandwidth=0, seed=0, methods=["GET"], slow_s=0.3,
                          faults=["reset", "500", "503", "429", "truncate", "slow"], trickle_s=0.5,
                          spare_manifest=True, paths=None)
    loopback_s3.reset()
    loopback_s3.bucket = f"t{zlib.crc32(request.node.nodeid.encode()):08x}"  # type: ignore[attr-defined]
    loopback_s3.create_bucket(loopback_s3.bucket)  # type: ignore[attr-defined]
    yield loopback_s3
    loopback_s3.configure(fault_rate=0.0, latency_s=0.0, bandwidth=0, spare_manifest=True, paths=None)


def options_for(server: LoopbackS3, cache: Path, **changes: Any) -> RemoteOptions:
    """RemoteOptions reaching the proxy (checked loopback), with fast retries for tests."""
    settings: dict[str, Any] = dict(endpoint_url=check_loopback(server.proxy), region="us-east-1",
                                    cache_dir=str(cache), backoff_s=0.01, timeout_s=5.0, deadline_s=30.0,
                                    extent_bytes=64 << 10, request_bytes=256 << 10)
    settings.update(changes)
    return RemoteOptions(**settings)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local dataset of 3 classes x 40 JPEGs in several shards (built once per session), each
    sample on its own 4 KiB page: the cache-bound tests count extents of two samples."""
    from packer.writer import BuildOptions, build

    root = tmp_path_factory.mktemp("remote-src")
    write_images(root / "src", {"cat": 40, "dog": 40, "eel": 40}, size=40)
    build(root / "src", root / "ds", BuildOptions(shard_size=96 << 10, alignment=4096), workers=1)
    return root / "ds"


@pytest.fixture
def plain_http(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A web server that does not serve byte ranges (``python -m http.server``'s handler: a Range
    request gets 200 and the whole file) on 127.0.0.1, serving a fresh folder: (base URL, folder)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    folder = tmp_path / "www"
    folder.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield check_loopback(f"http://127.0.0.1:{server.server_address[1]}"), folder
    finally:
        server.shutdown()
        server.server_close()


def fake_fsspec_store(monkeypatch: pytest.MonkeyPatch, protocol: str, module: str, class_name: str) -> type:
    """Stand in for gcsfs / adlfs (not installed by the dev extra, and their servers are not on
    loopback): an in-memory fsspec filesystem registered for ``protocol`` and importable as
    ``module.class_name``, so packer's fsspec transport builds and uses it exactly as the real one.
    Its keyword arguments are recorded (``Fake.made``)."""
    import importlib
    import types

    from fsspec.implementations.memory import MemoryFileSystem

    class Fake(MemoryFileSystem):
        store: dict = {}
        pseudo_dirs = [""]
        made: list = []

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            Fake.made.append(dict(kwargs))
            super().__init__()

    Fake.__name__ = class_name
    # a Store made by an earlier test (or an earlier pytest session in this process, as mutmut runs
    # its sessions) for the same URL would hold another Fake's files
    from packer.remote import store as store_module

    monkeypatch.setattr(store_module, "_STORES", {})
    fake = types.ModuleType(module)
    setattr(fake, class_name, Fake)
    monkeypatch.setitem(sys.modules, module, fake)
    monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, protocol, Fake)
    return Fake


class MemoryTransport:
    """An in-memory store behind packer's transport protocol, with S3's semantics: ranges clamped
    at the object's end (416 from byte 0 of an empty object), ETags (MD5 of the bytes), and
    conditional writes (If-Match / If-None-Match). ``calls`` counts requests by kind; ``fail``
    maps a kind ("get_range", "head", "put_bytes", ...) to an exception raised instead."""

    conditional = True

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.calls: dict[str, int] = {}
        self.fail: dict[str, BaseException] = {}

    def _count(self, kind: str) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        if kind in self.fail:
            raise self.fail[kind]

    def _etag(self, key: str) -> str:
        import hashlib

        return '"' + hashlib.md5(self.objects[key]).hexdigest() + '"'

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._count("get_range")
        if key not in self.objects:
            raise FileNotFoundError(key)
        data = self.objects[key]
        if start >= len(data):
            import errno as _errno

            raise OSError(_errno.EINVAL, "The requested range is not satisfiable") if start else _status_416()
        return data[start:end]

    def head(self, key: str) -> Any:
        from packer.remote.store import ObjectInfo

        self._count("head")
        if key not in self.objects:
            raise FileNotFoundError(key)
        return ObjectInfo(size=len(self.objects[key]), etag=self._etag(key))

    def put_file(self, key: str, path: str) -> None:
        self._count("put_file")
        self.objects[key] = Path(path).read_bytes()

    def put_bytes(self, key: str, data: bytes, *, if_match: Any = None, if_absent: bool = False) -> None:
        self._count("put_bytes")
        if if_absent and key in self.objects:
            raise FileExistsError(key)
        if if_match is not None and (key not in self.objects or self._etag(key) != if_match.etag):
            raise _status_412()
        self.objects[key] = bytes(data)

    def delete(self, key: str) -> None:
        self._count("delete")
        self.objects.pop(key, None)

    def load_folder(self, folder: Path, prefix: str) -> None:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                self.objects[f"{prefix}/{path.relative_to(folder).as_posix()}"] = path.read_bytes()


def _status_416() -> Exception:
    from packer.remote.store import _HttpStatus

    return _HttpStatus(416, "Range Not Satisfiable")


def _status_412() -> Exception:
    from packer.remote.store import _HttpStatus

    return _HttpStatus(412, "Precondition Failed")


def memory_store(monkeypatch: pytest.MonkeyPatch, transport: MemoryTransport) -> None:
    """Every ``Store`` packer makes in this test reads and writes ``transport``."""
    from packer.remote import reader, store, upload

    made_for: dict[tuple[str, str], Any] = {}

    def made(url: Any, options: RemoteOptions) -> Any:
        key = (url.text, repr(options))
        if key not in made_for:
            made_for[key] = store.Store(url, options, transport=transport)
        return made_for[key]

    for module in (store, reader, upload):
        monkeypatch.setattr(module, "store_for", made)
