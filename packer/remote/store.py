"""The transport: one client per process (fork-aware), bounded requests, retries with backoff and a
deadline, conditional writes.

Two transports sit behind one small protocol (``get_range``, ``head``, ``put_file``, ``put_bytes``,
``delete``): fsspec (s3fs, gcsfs, adlfs, HTTP; the default) and obstore (Rust ``object_store``).
Both come from well-kept libraries; packer writes no HTTP protocol of its own, only the bounded
read of a plain web server's answer (fsspec's HTTP reads a whole body). ``Store`` adds what
training needs on top:

* **Every request is bounded.** A request, body included, takes at most
  ``RemoteOptions.timeout_s`` (wall clock, not a socket timeout that a body trickling one byte at a
  time keeps resetting): fsspec's coroutines run under ``asyncio.wait_for``, obstore's client has
  reqwest's whole-request timeout. A read asks for a byte range and accepts no more than it asked
  (``read_prefix`` reads an object of unknown size up to a limit plus one byte, so a 1 GiB
  ``manifest.json`` costs 64 MiB, not 1 GiB). A server that answers a range request with the whole
  object (HTTP 200, as ``python -m http.server`` does) is read whole only when the object fits what
  was asked from byte 0; otherwise the error names the server's behaviour.
* **One retry policy** (``classify``, a table from every error class of every transport to a
  verdict): a reset connection, 5xx, 429/503 throttling, a truncated body, a timeout are retried with
  exponential backoff and jitter until ``retries`` attempts or ``deadline_s`` have passed; a missing
  object, a refused permission, missing credentials, a bad request are final at once. The
  libraries' own retries are off (botocore's and s3fs's, object_store's), so a count is packer's.
* **Conditional writes** (``put_bytes(..., if_match=, if_absent=)``): S3 ``If-Match`` /
  ``If-None-Match`` (s3fs and obstore), GCS generation and Azure ETag preconditions (obstore).
  ``Store.conditional`` says whether the transport has them; the uploader takes a lock object where
  it has not (fsspec's ``gs://`` and ``az://``).

Fork safety: ``store_for`` keeps one client per (process, store); a forked DataLoader worker
never uses a client its parent made (the table is dropped in the child, ``os.register_at_fork``),
it makes its own. obstore's tokio runtime is process-wide and does not survive a fork: a child of
a process that used it would hang, so ``ObstoreTransport`` refuses to run there (typed error).
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Protocol

from ..errors import MissingDependencyError, OptionError, PackerError, RemoteStoreError
from .options import RemoteOptions
from .url import DatasetURL, redact

__all__ = ["ObjectInfo", "Transport", "Store", "store_for", "INSTALL_HINT", "classify", "RETRY", "FINAL", "MISSING",
           "DENIED", "PRECONDITION", "UNSATISFIABLE", "NO_RANGE", "PreconditionFailed"]

INSTALL_HINT = "pip install 'packer-shards[remote]'"
#: The narrow extra that installs one kind of URL's transport (``[remote]`` installs them all).
SCHEME_EXTRAS = {"s3": "s3", "gs": "gcs", "az": "azure", "https": "http", "http": "http"}

# --- verdicts ---------------------------------------------------------------------------------------

#: A transient failure: retried with backoff until the attempts or the deadline run out.
RETRY = "retry"
#: A failure retrying cannot fix (denied, a bad request, no credentials): final at once.
FINAL = "final"
#: The object does not exist (404, NoSuchKey, NotFoundError): final; ``head`` answers None.
MISSING = "missing"
#: Access refused (401, 403, AccessDenied, PermissionDeniedError): final. S3 answers a HEAD of a
#: missing key with 403 when the caller may not list the bucket, so ``head`` answers None too.
DENIED = "denied"
#: A conditional write's precondition did not hold (412, If-None-Match on an existing object).
PRECONDITION = "precondition"
#: A range starting at or past the object's end (416): an empty object for a read from byte 0.
UNSATISFIABLE = "unsatisfiable"
#: The server does not serve byte ranges (a 200 with the whole object to a range request).
NO_RANGE = "no-range"


@dataclass(frozen=True)
class ObjectInfo:
    """An object's size and the tokens a conditional write names it by (ETag; GCS generation)."""

    size: int
    etag: str | None
    version: str | None = None


class Transport(Protocol):
    """What a transport does: keys are relative to the dataset URL's bucket (prefix included).

    ``get_range`` returns at most ``end - start`` bytes (fewer at the object's end) and reads no
    more from the wire; ``put_bytes`` with ``if_match`` / ``if_absent`` raises an error that
    ``classify`` calls ``PRECONDITION`` when the condition fails (``conditional`` False: the
    transport cannot make the condition, and the caller must not ask).
    """

    conditional: bool

    def get_range(self, key: str, start: int, end: int) -> Any: ...

    def head(self, key: str) -> ObjectInfo: ...

    def put_file(self, key: str, path: str) -> None: ...

    def put_bytes(self, key: str, data: bytes, *, if_match: ObjectInfo | None = None,
                  if_absent: bool = False) -> None: ...

    def delete(self, key: str) -> None: ...


class _Truncated(Exception):
    """A body shorter than the range asked (the connection ended early): retried."""


class _Oversize(Exception):
    """A body longer than the range asked: the server does not honour the range."""


class _NoRange(Exception):
    """A 200 with the whole object to a range request that the whole object does not fit."""


class _Timeout(Exception):
    """One request, body included, ran past ``timeout_s``."""


class _HttpStatus(Exception):
    """A web server's non-2xx answer (the fsspec HTTP transport's bounded read)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status


class PreconditionFailed(RemoteStoreError):
    """A conditional write found the object changed (or present): another writer got there first."""


def _missing(package: str, exc: BaseException, scheme: str = "") -> MissingDependencyError:
    extra = SCHEME_EXTRAS.get(scheme, "remote")
    return MissingDependencyError(f"reading datasets in object storage needs {package} ({exc}); install it with "
                                  f"pip install 'packer-shards[{extra}]' (or [remote]: every store)")


# --- the retry classification ------------------------------------------------------------------------

def _status_verdict(status: int) -> str:
    """An HTTP status's verdict (the same rule for every transport that exposes the status)."""
    if status in (404, 410):
        return MISSING
    if status in (401, 403):
        return DENIED
    if status == 412:
        return PRECONDITION
    if status == 416:
        return UNSATISFIABLE
    if status in (408, 425, 429) or (status >= 500 and status not in (501, 505)):
        return RETRY
    return FINAL


#: Error classes by (top-level package, class name) -> verdict, looked up along the error's MRO
#: (the first match wins), so no transport library is imported to classify its errors.
_BY_CLASS: dict[tuple[str, str], str] = {
    # botocore: connection and body failures are transient; configuration, credentials and
    # parameter errors (every other BotoCoreError) are final. ClientError goes by its code/status.
    ("botocore", "HTTPClientError"): RETRY,          # ConnectionClosedError, ReadTimeoutError,
                                                     # ResponseStreamingError
    ("botocore", "IncompleteReadError"): RETRY,
    ("botocore", "ResponseStreamingError"): RETRY,
    ("botocore", "ConnectionError"): RETRY,          # EndpointConnectionError, ConnectTimeoutError,
                                                     # ProxyConnectionError, SSLError
    ("botocore", "ChecksumError"): RETRY,            # a damaged body
    ("botocore", "FlexibleChecksumError"): RETRY,
    ("botocore", "CapacityNotAvailableError"): RETRY,
    ("botocore", "ResponseParserError"): RETRY,      # a cut XML answer
    ("botocore", "BotoCoreError"): FINAL,            # NoCredentialsError, ParamValidationError, ...
    ("urllib3", "IncompleteRead"): RETRY,
    ("urllib3", "ProtocolError"): RETRY,
    # aiohttp (fsspec's HTTP and, below aiobotocore, s3fs's bodies)
    ("aiohttp", "ClientPayloadError"): RETRY,
    ("aiohttp", "ServerDisconnectedError"): RETRY,
    ("aiohttp", "ServerTimeoutError"): RETRY,
    ("aiohttp", "ConnectionTimeoutError"): RETRY,
    ("aiohttp", "SocketTimeoutError"): RETRY,
    ("aiohttp", "ClientConnectorCertificateError"): FINAL,  # a certificate will not change
    ("aiohttp", "ServerFingerprintMismatch"): FINAL,
    ("aiohttp", "ClientConnectionError"): RETRY,     # ClientOSError, ClientConnectorError, ...
    ("aiohttp", "InvalidURL"): FINAL,
    ("aiohttp", "InvalidUrlClientError"): FINAL,
    ("aiohttp", "NonHttpUrlClientError"): FINAL,
    ("aiohttp", "RedirectClientError"): FINAL,     # InvalidUrlRedirectClientError, NonHttpUrlRedirectClientError
    ("aiohttp", "TooManyRedirects"): FINAL,
    ("aiohttp", "ClientError"): RETRY,
    ("fsspec", "FSTimeoutError"): RETRY,
    # obstore: the classes of obstore.exceptions
    ("obstore", "NotFoundError"): MISSING,
    ("obstore", "PreconditionError"): PRECONDITION,
    ("obstore", "AlreadyExistsError"): PRECONDITION,
    ("obstore", "PermissionDeniedError"): DENIED,
    ("obstore", "UnauthenticatedError"): DENIED,
    ("obstore", "InvalidPathError"): FINAL,
    ("obstore", "NotSupportedError"): FINAL,         # NO_RANGE when it is a range request
    ("obstore", "NotModifiedError"): FINAL,
    ("obstore", "UnknownConfigurationKeyError"): FINAL,
    ("obstore", "JoinError"): RETRY,
    ("obstore", "GenericError"): RETRY,              # by the status in its text when there is one
    ("obstore", "BaseError"): RETRY,
}

#: An ``OSError``'s errno -> verdict (s3fs translates S3 error codes into errnos).
_BY_ERRNO: dict[int, str] = {
    errno.EIO: RETRY, getattr(errno, "EREMOTEIO", errno.EIO): RETRY,  # InternalError, an unknown code
    errno.EBUSY: RETRY,                              # SlowDown, ServiceUnavailable, OperationAborted
    errno.EAGAIN: RETRY, errno.ETIMEDOUT: RETRY, errno.ECONNRESET: RETRY, errno.ECONNABORTED: RETRY,
    errno.ECONNREFUSED: RETRY, errno.EPIPE: RETRY, errno.ENETUNREACH: RETRY, errno.EHOSTUNREACH: RETRY,
    errno.EINVAL: FINAL,                             # 400s: InvalidArgument, InvalidRange, ...
    errno.EPERM: FINAL, errno.EACCES: FINAL, errno.ENOSYS: FINAL,
    getattr(errno, "EREMCHG", errno.ENOENT): FINAL,  # a redirect: the bucket is in another region
    getattr(errno, "EMSGSIZE", errno.EINVAL): FINAL, errno.ENAMETOOLONG: FINAL,
    getattr(errno, "ENOTEMPTY", errno.EINVAL): FINAL, errno.ENOSPC: FINAL, errno.EROFS: FINAL,
}

_STATUS_IN_TEXT = re.compile(r"(?:status code:?|HTTP(?:/1\.[01])?)\s*(\d{3})\b")


def _client_error_verdict(exc: BaseException) -> str | None:
    """A botocore ``ClientError`` (its error code and HTTP status), anywhere in the cause chain."""
    seen = 0
    while exc is not None and seen < 5:
        response = getattr(exc, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            code = str(response["Error"].get("Code", ""))
            if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return PRECONDITION
            if code in ("NoSuchKey", "NoSuchBucket", "NotFound", "404"):
                return MISSING
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
                return DENIED
            if code == "InvalidRange":
                return UNSATISFIABLE
            if code in ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "TooManyRequests",
                        "Throttling", "ThrottlingException"):
                return RETRY
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return _status_verdict(status)
            if code.isdigit():
                return _status_verdict(int(code))
            return FINAL
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return None


def classify(exc: BaseException) -> str:
    """The verdict on a transport's error: ``RETRY``, ``FINAL``, ``MISSING``, ``DENIED``, ``PRECONDITION``,
    ``UNSATISFIABLE`` or ``NO_RANGE`` (the table: ``_BY_CLASS``, ``_BY_ERRNO``, HTTP statuses).

    ``ValueError``, ``KeyError`` and ``NotImplementedError`` outside the table are final (a bad
    argument or configuration); any other error class no rule names is retried (a network
    library's own transient error), within the attempts and the deadline; ``tests/remote/test_remote_retry_table.py`` pins every class of
    every transport.
    """
    if isinstance(exc, (_Truncated, _Timeout, asyncio.TimeoutError, TimeoutError)):
        return RETRY
    if isinstance(exc, (_Oversize, _NoRange)):
        return NO_RANGE
    if isinstance(exc, _HttpStatus):
        return _status_verdict(exc.status)
    verdict = _client_error_verdict(exc)
    if verdict is not None:
        return verdict
    if isinstance(exc, FileExistsError):
        return PRECONDITION  # s3fs's If-None-Match failure
    if isinstance(exc, FileNotFoundError):
        return MISSING
    if isinstance(exc, PermissionError):
        return DENIED
    for cls in type(exc).__mro__:
        verdict = _BY_CLASS.get((cls.__module__.split(".")[0], cls.__name__))
        if verdict is None:
            continue
        if verdict == RETRY and cls.__module__.startswith("obstore"):
            match = _STATUS_IN_TEXT.search(str(exc))
            if match:
                return _status_verdict(int(match.group(1)))
        if cls.__module__.startswith("obstore") and cls.__name__ == "NotSupportedError" and "Range" in str(exc):
            return NO_RANGE
        if cls.__module__.startswith("aiohttp") and isinstance(getattr(exc, "status", None), int) and exc.status:
            return _status_verdict(exc.status)  # ClientResponseError
        return verdict
    if isinstance(exc, ConnectionError):
        return RETRY
    if isinstance(exc, (ValueError, KeyError, NotImplementedError)):
        return FINAL  # a bad argument or configuration (botocore's "Invalid endpoint"): no retry mends it
    if isinstance(exc, OSError) and exc.errno is not None:
        return _BY_ERRNO.get(exc.errno, RETRY)
    return RETRY


# --- fsspec --------------------------------------------------------------------------------------------

async def _bounded(coroutine: Any, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(coroutine, timeout)
    except asyncio.TimeoutError:
        raise _Timeout(f"no complete answer within timeout_s={timeout:g} s (body included)") from None


class FsspecTransport:
    """fsspec's filesystems: s3fs (``s3://``), gcsfs (``gs://``), adlfs (``az://``), HTTP (``https://``)."""

    _PROTOCOLS = {"s3": "s3", "gs": "gcs", "az": "az", "https": "https", "http": "http"}

    def __init__(self, url: DatasetURL, options: RemoteOptions) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise _missing("fsspec", exc, url.scheme) from None
        protocol = self._PROTOCOLS[url.scheme]
        self.protocol = protocol
        self.timeout = options.timeout_s
        kwargs: dict[str, Any] = {"skip_instance_cache": True}
        if protocol == "s3":
            try:
                import s3fs  # noqa: F401
            except ImportError as exc:
                raise _missing("s3fs", exc, url.scheme) from None
            # packer retries (one policy for every transport, counted per range): botocore's and
            # s3fs's own retries are off, the socket timeouts are ours.
            kwargs.update(config_kwargs={"retries": {"max_attempts": 1, "mode": "standard"},
                                                    "connect_timeout": options.timeout_s,
                                                    "read_timeout": options.timeout_s})
            if options.endpoint_url:
                kwargs["endpoint_url"] = options.endpoint_url
            if options.region:
                kwargs["client_kwargs"] = {"region_name": options.region}
        elif protocol in ("http", "https"):
            try:
                import aiohttp  # fsspec[http]'s client ([http]; s3fs brings it too)
            except ImportError as exc:
                raise _missing("aiohttp", exc, url.scheme) from None

            kwargs["client_kwargs"] = {"timeout": aiohttp.ClientTimeout(total=options.timeout_s)}
        kwargs.update(options.storage_options)
        try:
            self.fs = fsspec.filesystem(protocol, **kwargs)
        except ImportError as exc:
            raise _missing(f"fsspec's {protocol} filesystem", exc, url.scheme) from None
        if protocol == "s3":
            self.fs.retries = 1  # s3fs's own retry loop (a class attribute, not an argument): off
        if getattr(self.fs, "async_impl", False) and hasattr(self.fs, "set_session"):
            from fsspec.asyn import sync

            try:  # the client is made now, not at the first request: a bad keyword is named here
                sync(self.fs.loop, self.fs.set_session)
            except TypeError as exc:
                raise OptionError(f"RemoteOptions.storage_options does not fit fsspec's {protocol} client: "
                                  f"{_first_line(exc)}", path=url.text) from None
        self._root = (f"{url.scheme}://{url.bucket}" if protocol in ("http", "https") else url.bucket)
        #: S3 (s3fs passes If-Match / If-None-Match to PutObject); gcsfs and adlfs expose no
        #: precondition on an existing object through fsspec: a lock object stands in.
        self.conditional = protocol == "s3"

    def _path(self, key: str) -> str:
        return f"{self._root}/{key}"

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``fs.<name>`` bounded by ``timeout_s``, body included: an async filesystem's coroutine
        under ``asyncio.wait_for`` on its loop (the cancelled request closes its connection)."""
        fs = self.fs
        if getattr(fs, "async_impl", False) and hasattr(fs, "_" + name):
            from fsspec.asyn import sync

            return sync(fs.loop, _bounded, getattr(fs, "_" + name)(*args, **kwargs), self.timeout)
        return getattr(fs, name)(*args, **kwargs)

    def get_range(self, key: str, start: int, end: int) -> Any:
        if start >= end:
            return b""
        if self.protocol in ("http", "https"):
            from fsspec.asyn import sync

            return sync(self.fs.loop, _bounded, self._http_range(self._path(key), start, end), self.timeout)
        return self._run("cat_file", self._path(key), start=start, end=end)

    async def _http_range(self, url: str, start: int, end: int) -> bytes:
        """A range GET read at most ``end - start`` (+1, to see a longer answer) bytes deep.

        fsspec's own ``cat_file`` reads a whole body, whatever the server sends; here a 200 (the
        server ignores ``Range``) is accepted only from byte 0 and only when the whole object fits
        the range asked."""
        fs = self.fs
        session = await fs.set_session()
        request = dict(fs.kwargs)
        headers = dict(request.pop("headers", None) or {})
        headers["Range"] = f"bytes={start}-{end - 1}"
        want = end - start
        async with session.get(fs.encode_url(url), headers=headers, **request) as response:
            if response.status == 416:
                raise _HttpStatus(416, "Range Not Satisfiable")
            if response.status >= 400:
                if response.status == 404:
                    raise FileNotFoundError(f"{url}: HTTP 404 Not Found")
                if response.status in (401, 403):
                    raise PermissionError(f"{url}: HTTP {response.status} {response.reason}")
                raise _HttpStatus(response.status, str(response.reason))
            whole = response.status != 206
            if whole and start != 0:
                raise _NoRange(f"the server answered a range request (bytes {start}-{end - 1}) with HTTP "
                               f"{response.status} and the whole object: it does not serve byte ranges")
            pieces: list[bytes] = []
            got = 0
            while got <= want:
                piece = await response.content.read(min(1 << 20, want + 1 - got))
                if not piece:
                    break
                pieces.append(piece)
                got += len(piece)
            if got > want:
                if whole:
                    raise _NoRange(f"the server answered a range request (bytes {start}-{end - 1}) with HTTP "
                                   f"{response.status} and the whole object, which is larger: it does not serve "
                                   f"byte ranges")
                raise _Oversize(f"the server sent more than the {want} bytes of the range asked")
            return b"".join(pieces)

    def head(self, key: str) -> ObjectInfo:
        info = self._run("info", self._path(key))
        etag = info.get("ETag") or info.get("etag")
        generation = info.get("generation")
        return ObjectInfo(size=int(info["size"]), etag=str(etag) if etag else None,
                          version=str(generation) if generation else None)

    def put_file(self, key: str, path: str) -> None:
        # s3fs uploads a large file as a multipart upload, parts in parallel (max_concurrency);
        # each part is bounded by the socket timeouts, not by one wall-clock limit for the file.
        self.fs.put_file(path, self._path(key))

    def put_bytes(self, key: str, data: bytes, *, if_match: ObjectInfo | None = None,
                  if_absent: bool = False) -> None:
        if if_match is not None or if_absent:
            if not self.conditional:
                raise OptionError(f"the fsspec {self.protocol} transport has no conditional write")
            condition = {"IfNoneMatch": "*"} if if_absent else {"IfMatch": if_match.etag}  # type: ignore[union-attr]
            bucket, _, name = self._path(key).partition("/")
            self._run("call_s3", "put_object", Bucket=bucket, Key=name, Body=data, **condition)
            return
        self._run("pipe_file", self._path(key), data)

    def delete(self, key: str) -> None:
        self._run("rm_file", self._path(key))


# --- obstore -------------------------------------------------------------------------------------------

#: The process that first used obstore's runtime (it cannot be used again after a fork).
_OBSTORE_PID: int | None = None


class ObstoreTransport:
    """obstore (Rust ``object_store``): S3, GCS, Azure and HTTP with native range reads, and
    conditional puts on all three stores (S3 ETag, GCS generation, Azure ETag)."""

    conditional = True

    def __init__(self, url: DatasetURL, options: RemoteOptions) -> None:
        global _OBSTORE_PID
        if _OBSTORE_PID is not None and _OBSTORE_PID != os.getpid():
            raise RemoteStoreError(
                "transport='obstore' cannot run in a process forked from one that already used it (its "
                "tokio runtime does not survive fork: the request would hang); use the default "
                "transport='fsspec', or start workers with multiprocessing_context='spawn'", path=url.text)
        try:
            import obstore
            from obstore.store import from_url
        except ImportError as exc:
            raise _missing("obstore", exc, url.scheme) from None
        _OBSTORE_PID = os.getpid()
        self._obstore = obstore
        self.conditional = url.scheme in ("s3", "gs", "az")
        # reqwest's timeout is the whole request, from connecting to the body's last byte
        client_options: dict[str, Any] = {"timeout": f"{options.timeout_s}s",
                                          "connect_timeout": f"{options.timeout_s}s"}
        config: dict[str, Any] = {}
        if options.endpoint_url:
            config["endpoint"] = options.endpoint_url
            client_options["allow_http"] = options.endpoint_url.startswith("http://")
        if url.scheme == "http":
            client_options["allow_http"] = True
        if options.region:
            config["region"] = options.region
        config.update(options.storage_options)
        root = f"{url.scheme}://{url.bucket}/"
        # packer retries (one policy for every transport): object_store's own retries are off.
        try:
            self.store = from_url(root, config=config or None, client_options=client_options,
                                  retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=options.deadline_s),
                                                "backoff": {"init_backoff": timedelta(milliseconds=10),
                                                            "max_backoff": timedelta(milliseconds=10), "base": 2}})
        except Exception as exc:  # noqa: BLE001 - obstore's configuration errors (no Azure account, a bad key)
            raise OptionError(f"cannot make an obstore client for {url.text}: {_first_line(exc)} (give the store's "
                              f"settings in RemoteOptions.storage_options or its environment variables, e.g. "
                              f"AZURE_STORAGE_ACCOUNT_NAME)", path=url.text) from None

    def get_range(self, key: str, start: int, end: int) -> Any:
        if start >= end:
            return b""
        try:
            return self._obstore.get_range(self.store, key, start=start, end=end)
        except Exception as exc:  # noqa: BLE001 - classified, then retried or raised by Store
            if start != 0 or classify(exc) != NO_RANGE:
                raise
        # a server without ranges: the whole object, read at most ``end`` + 1 bytes deep
        pieces: list[bytes] = []
        got = 0
        for chunk in self._obstore.get(self.store, key).stream(min_chunk_size=1 << 20):
            pieces.append(bytes(chunk))
            got += len(pieces[-1])
            if got > end:
                raise _NoRange(f"the server does not serve byte ranges and the object is larger than the "
                               f"{end} bytes asked")
        return b"".join(pieces)

    def head(self, key: str) -> ObjectInfo:
        meta = self._obstore.head(self.store, key)
        version = meta.get("version")
        return ObjectInfo(size=int(meta["size"]), etag=meta.get("e_tag"), version=str(version) if version else None)

    def put_file(self, key: str, path: str) -> None:
        with open(path, "rb") as file:
            self._obstore.put(self.store, key, file, use_multipart=os.path.getsize(path) > (8 << 20),
                              chunk_size=8 << 20, max_concurrency=8)

    def put_bytes(self, key: str, data: bytes, *, if_match: ObjectInfo | None = None,
                  if_absent: bool = False) -> None:
        mode: Any = None
        if if_absent:
            mode = "create"
        elif if_match is not None:
            mode = {key: value for key, value in (("e_tag", if_match.etag), ("version", if_match.version)) if value}
        self._obstore.put(self.store, key, data, mode=mode)

    def delete(self, key: str) -> None:
        self._obstore.delete(self.store, key)


# --- the store -----------------------------------------------------------------------------------------

class Store:
    """One dataset URL's objects through a transport, with retries, a deadline and request counts.

    Attributes:
        url: the dataset URL.
        requests, bytes_read: GETs sent (retries included) and bytes received by this process.
        retried: attempts that failed transiently and were tried again.
    """

    def __init__(self, url: DatasetURL, options: RemoteOptions, transport: Transport | None = None) -> None:
        self.url = url
        self.options = options
        if transport is None:
            transport = (ObstoreTransport if options.transport == "obstore" else FsspecTransport)(url, options)
        self.transport = transport
        self.requests = 0
        self.bytes_read = 0
        self.retried = 0
        self._lock = threading.Lock()
        self._jitter = random.Random(os.getpid() ^ id(self))  # pauses only: never touches data

    @property
    def conditional(self) -> bool:
        """Whether writes can carry preconditions (else the uploader takes a lock object)."""
        return bool(getattr(self.transport, "conditional", False))

    def key(self, relative: str) -> str:
        return self.url.key(relative)

    def _attempts(self, what: str, call: Callable[[], Any], check: Callable[[Any], None] | None = None,
                  *, counts: bool = True) -> Any:
        options = self.options
        started = time.monotonic()
        pause = options.backoff_s
        attempt = 0
        while True:
            attempt += 1
            with self._lock:
                self.requests += 1
            try:
                data = call()
                if check is not None:
                    check(data)
                if counts and data is not None and hasattr(data, "__len__"):
                    with self._lock:
                        self.bytes_read += len(data)
                return data
            except (PackerError, TypeError, AttributeError, NameError):
                raise  # packer's own errors, and programming errors, are not the network's
            except Exception as exc:  # noqa: BLE001 - classified: retried, or final
                verdict = classify(exc)
                if verdict == MISSING:
                    raise _final(verdict, f"{what} failed: {_first_line(exc)} (not retried: the object does not "
                                          f"exist)", self.url.text) from None
                if verdict == NO_RANGE:
                    raise _final(verdict, f"{what} failed: {_first_line(exc)} (not retried: packer reads "
                                          f"datasets from servers that answer Range requests with 206 Partial "
                                          f"Content; copy the dataset to a bucket or a local folder)",
                                 self.url.text) from None
                if verdict == DENIED:
                    raise _final(verdict, f"{what} failed: {_first_line(exc)} (not retried: the store refused "
                                          f"access; check the credentials and the bucket's permissions)",
                                 self.url.text) from None
                if verdict != RETRY:
                    raise _final(verdict, f"{what} failed: {_first_line(exc)} (not retried: the store answered "
                                          f"that it cannot be done as asked)", self.url.text) from None
                elapsed = time.monotonic() - started
                wait = min(pause, 5.0) * (0.5 + self._jitter.random())
                if attempt >= options.retries or elapsed + wait > options.deadline_s:
                    raise RemoteStoreError(
                        f"{what} failed after {attempt} attempt{'s' * (attempt > 1)} in {elapsed:.1f} s: "
                        f"{type(exc).__name__}: {_first_line(exc)}", path=self.url.text) from None
                with self._lock:
                    self.retried += 1
                time.sleep(wait)
                pause *= 2

    def read_range(self, relative: str, start: int, end: int, *, what: str | None = None) -> Any:
        """Bytes ``[start, end)`` of ``relative`` (a bytes-like object of exactly that length).

        Raises:
            RemoteStoreError: a final failure, or transient ones past the retries or deadline;
                the message names the object and the range.
        """
        key = self.key(relative)
        label = what or relative
        expect = end - start

        def exact(data: Any) -> None:
            if len(data) < expect:
                raise _Truncated(f"got {len(data)} of {expect} bytes")
            if len(data) > expect:
                raise _Oversize(f"the store sent {len(data)} bytes for a range of {expect}")

        return self._attempts(f"range GET {label} bytes {start}-{end}",
                              lambda: self.transport.get_range(key, start, end), exact)

    def read_prefix(self, relative: str, limit: int, *, missing_ok: bool = False) -> bytes | None:
        """The object ``relative`` if it holds at most ``limit`` bytes, else its first ``limit + 1``
        bytes (the caller names the limit): never more is read, whatever the object's size.

        Returns:
            the bytes; None if the object does not exist and ``missing_ok``.

        Raises:
            RemoteStoreError: as ``read_range`` (a missing object names it, not retried).
        """
        key = self.key(relative)
        try:
            return bytes(self._attempts(f"GET {relative}", lambda: self.transport.get_range(key, 0, limit + 1)))
        except RemoteStoreError as exc:
            verdict = getattr(exc, "verdict", None)
            if verdict == UNSATISFIABLE:  # a range from byte 0 of an empty object
                return b""
            if verdict == MISSING and missing_ok:
                return None
            raise

    def head(self, relative: str) -> ObjectInfo | None:
        """The object's size and version tokens, or None when it does not exist (or, as S3 answers
        for a missing key to a caller that may not list the bucket, access is refused)."""
        key = self.key(relative)
        try:
            return self._attempts(f"HEAD {relative}", lambda: self.transport.head(key), counts=False)
        except RemoteStoreError as exc:
            if getattr(exc, "verdict", None) in (MISSING, DENIED):
                return None
            raise

    def put_file(self, relative: str, path: str) -> None:
        key = self.key(relative)
        self._attempts(f"upload {relative}", lambda: self.transport.put_file(key, path), counts=False)

    def put_bytes(self, relative: str, data: bytes, *, if_match: ObjectInfo | None = None,
                  if_absent: bool = False) -> None:
        """Write ``relative``; with ``if_match`` only over that version of it, with ``if_absent``
        only where nothing is.

        Raises:
            PreconditionFailed: the condition did not hold (another writer got there first).
            RemoteStoreError: the write failed after its retries.
        """
        key = self.key(relative)
        try:
            self._attempts(f"upload {relative}", lambda: self.transport.put_bytes(
                key, data, **({"if_match": if_match} if if_match is not None else {}),
                **({"if_absent": True} if if_absent else {})), counts=False)
        except RemoteStoreError as exc:
            if getattr(exc, "verdict", None) == PRECONDITION and (if_match is not None or if_absent):
                raise PreconditionFailed(f"upload {relative}: the object changed since it was read (its "
                                         f"precondition failed): another writer got there first",
                                         path=self.url.text) from None
            raise

    def delete(self, relative: str) -> None:
        key = self.key(relative)
        try:
            self._attempts(f"DELETE {relative}", lambda: self.transport.delete(key), counts=False)
        except RemoteStoreError as exc:
            if getattr(exc, "verdict", None) != MISSING:
                raise


def _final(verdict: str, message: str, path: str) -> RemoteStoreError:
    """A ``RemoteStoreError`` that carries the verdict that made it final (``verdict``, read by
    ``Store``'s callers: a missing object is None for ``head``)."""
    error = RemoteStoreError(message, path=path)
    error.verdict = verdict  # type: ignore[attr-defined]
    return error


def _first_line(exc: BaseException) -> str:
    """The first line of a transport's error, its URLs' secrets redacted (a library may quote the
    request URL, endpoint user-info or a signed query included)."""
    text = redact(str(exc).strip())
    return (text.splitlines() or [type(exc).__name__])[0][:300]


_STORES: dict[tuple[Any, ...], Store] = {}
_STORES_LOCK = threading.Lock()


def _forget_stores() -> None:
    """In a forked child: drop the parent's clients without touching them (they are not ours)."""
    global _STORES_LOCK
    _STORES.clear()
    _STORES_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_stores)


def store_for(url: DatasetURL, options: RemoteOptions) -> Store:
    """This process's ``Store`` for ``url`` (made on first use; a forked child makes its own)."""
    key = (os.getpid(), url.scheme, url.bucket, url.prefix, options.transport, options.endpoint_url, options.region,
           repr(sorted((str(k), repr(v)) for k, v in options.storage_options.items())),
           options.retries, options.deadline_s, options.timeout_s, options.backoff_s)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = Store(url, options)
        return store
