"""The retry classification as a table (issue 41): every error class of every transport -> retried
or final (and which final: missing, denied, precondition, unsatisfiable range, no ranges), checked
against ``packer.remote.store.classify`` and, for each transport, through a fake of the library
under it (the transport's own wrapping included): a retried error costs ``retries`` attempts, a
final one exactly one. A permission error retried until the deadline looks like a flaky network;
a 503 given up at once loses a job to one throttled request."""

from __future__ import annotations

import errno
import inspect

import pytest

from packer.errors import RemoteStoreError
from packer.remote import RemoteOptions, parse_url
from packer.remote.store import (DENIED, FINAL, MISSING, NO_RANGE, PRECONDITION, RETRY, UNSATISFIABLE,
                                 FsspecTransport, Store, _HttpStatus, _Timeout, _Truncated, classify)

#: S3 error codes as s3fs sees them (its translate table's codes), with the HTTP status AWS sends
#: (docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html), and the verdict packer gives.
S3_CODES = {
    "InternalError": (500, RETRY), "SlowDown": (503, RETRY), "ServiceUnavailable": (503, RETRY),
    "RequestTimeout": (400, RETRY), "TooManyRequests": (429, RETRY), "OperationAborted": (409, FINAL),
    "NoSuchKey": (404, MISSING), "NoSuchBucket": (404, MISSING), "NoSuchUpload": (404, MISSING),
    "NoSuchVersion": (404, MISSING), "NoSuchBucketPolicy": (404, MISSING), "NoSuchLifecycleConfiguration": (404, MISSING),
    "AccessDenied": (403, DENIED), "InvalidAccessKeyId": (403, DENIED), "SignatureDoesNotMatch": (403, DENIED),
    "ExpiredToken": (400, DENIED), "AccountProblem": (403, DENIED), "AllAccessDisabled": (403, DENIED),
    "RequestTimeTooSkewed": (403, DENIED), "InvalidObjectState": (403, DENIED), "InvalidPayer": (403, DENIED),
    "InvalidSecurity": (403, DENIED), "NotSignedUp": (403, DENIED), "CrossLocationLoggingProhibited": (403, DENIED),
    "IllegalLocationConstraintException": (400, FINAL), "PreconditionFailed": (412, PRECONDITION),
    "InvalidRange": (416, UNSATISFIABLE), "NotImplemented": (501, FINAL), "MethodNotAllowed": (405, FINAL),
    "PermanentRedirect": (301, FINAL), "TemporaryRedirect": (307, FINAL), "Redirect": (307, FINAL),
    "BucketAlreadyExists": (409, FINAL), "BucketAlreadyOwnedByYou": (409, FINAL), "BucketNotEmpty": (409, FINAL),
    "RestoreAlreadyInProgress": (409, FINAL), "EntityTooLarge": (400, FINAL), "KeyTooLongError": (400, FINAL),
}


def _s3_error(code: str, status: int) -> Exception:
    """The exception s3fs raises for an S3 error answer: botocore's ClientError, translated."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    error = ClientError({"Error": {"Code": code, "Message": f"injected {code}"},
                         "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")
    return translate_boto_error(error)


def test_every_s3_error_code_s3fs_knows_has_a_verdict():
    pytest.importorskip("s3fs")
    from s3fs.errors import ERROR_CODE_TO_EXCEPTION

    for code in ERROR_CODE_TO_EXCEPTION:
        status, verdict = S3_CODES.get(code, (int(code) if code.isdigit() else 400, None))
        if verdict is None:  # a bare status as the code, or another 400 (a bad argument, a malformed request)
            verdict = {301: FINAL, 307: FINAL, 400: FINAL, 403: DENIED, 404: MISSING, 405: FINAL, 409: FINAL,
                       412: PRECONDITION, 416: UNSATISFIABLE, 500: RETRY, 501: FINAL, 503: RETRY}[status]
        assert classify(_s3_error(code, status)) == verdict, code


@pytest.mark.parametrize("error, verdict", [
    # what s3fs raises without botocore's answer underneath (its errno translation alone)
    (FileNotFoundError(errno.ENOENT, "gone"), MISSING), (PermissionError(errno.EACCES, "no"), DENIED),
    (FileExistsError(errno.EEXIST, "If-None-Match"), PRECONDITION), (TimeoutError("slow"), RETRY),
    (OSError(errno.EIO, "InternalError"), RETRY), (OSError(errno.EBUSY, "SlowDown"), RETRY),
    (OSError(errno.EINVAL, "InvalidArgument"), FINAL), (OSError(errno.ENOSYS, "NotImplemented"), FINAL),
    (OSError(errno.EREMCHG, "PermanentRedirect"), FINAL), (OSError(errno.EMSGSIZE, "EntityTooLarge"), FINAL),
    (ConnectionResetError(errno.ECONNRESET, "reset"), RETRY), (BrokenPipeError(errno.EPIPE, "pipe"), RETRY),
    (OSError(errno.ENOSPC, "full"), FINAL),
    # packer's own reasons
    (_Truncated("got 3 of 9 bytes"), RETRY), (_Timeout("slow body"), RETRY),
    (ValueError("Invalid endpoint: localhost:9"), FINAL), (RuntimeError("a library's own transient error"), RETRY),
])
def test_builtin_and_errno_errors(error, verdict):
    assert classify(error) == verdict


#: botocore's error classes that are retried; every other BotoCoreError is final.
BOTOCORE_RETRIED = {"HTTPClientError", "ConnectionClosedError", "ReadTimeoutError", "ResponseStreamingError",
                    "ConnectionError", "EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError",
                    "SSLError", "IncompleteReadError", "ChecksumError", "FlexibleChecksumError",
                    "CapacityNotAvailableError"}


def _blank(cls: type) -> BaseException:
    error = cls.__new__(cls)
    BaseException.__init__(error, f"injected {cls.__name__}")
    return error


def test_every_botocore_error_class():
    exceptions = pytest.importorskip("botocore.exceptions")
    seen = 0
    for name, cls in sorted(vars(exceptions).items()):
        if not (inspect.isclass(cls) and issubclass(cls, exceptions.BotoCoreError)):
            continue
        seen += 1
        assert classify(_blank(cls)) == (RETRY if name in BOTOCORE_RETRIED else FINAL), name
    assert seen > 60
    assert classify(exceptions.NoCredentialsError()) == FINAL  # was retried until the deadline


#: aiohttp's error classes (fsspec's HTTP, and s3fs's bodies): the final ones; others are retried.
AIOHTTP_FINAL = {"ClientConnectorCertificateError", "ServerFingerprintMismatch", "InvalidURL", "InvalidUrlClientError",
                 "InvalidUrlRedirectClientError", "NonHttpUrlClientError", "NonHttpUrlRedirectClientError",
                 "TooManyRedirects", "ContentTypeError", "ClientResponseError", "WSServerHandshakeError",
                 "ClientHttpProxyError", "BadContentDispositionHeader", "BadContentDispositionParam",
                 "WSMessageTypeError", "RedirectClientError"}


def test_every_aiohttp_error_class():
    aiohttp = pytest.importorskip("aiohttp")
    from aiohttp.client_exceptions import ClientResponseError

    for name, cls in sorted(vars(aiohttp).items()):
        if not (inspect.isclass(cls) and issubclass(cls, Exception)):
            continue
        error = _blank(cls)
        if isinstance(error, ClientResponseError):
            error.status = 400  # a response error goes by its status (below)
        expected = FINAL if name in AIOHTTP_FINAL else RETRY
        if name in ("BadContentDispositionHeader", "BadContentDispositionParam", "WSMessageTypeError"):
            continue  # warnings or websocket-only: never raised by a range GET
        assert classify(error) == expected, name
    response = _blank(ClientResponseError)
    for status, verdict in ((503, RETRY), (429, RETRY), (404, MISSING), (403, DENIED), (416, UNSATISFIABLE)):
        response.status = status
        assert classify(response) == verdict, status


#: obstore.exceptions -> verdict; a GenericError goes by the HTTP status in its text when it has one.
OBSTORE = {"NotFoundError": MISSING, "PreconditionError": PRECONDITION, "AlreadyExistsError": PRECONDITION,
           "PermissionDeniedError": DENIED, "UnauthenticatedError": DENIED, "InvalidPathError": FINAL,
           "NotSupportedError": FINAL, "NotModifiedError": FINAL, "UnknownConfigurationKeyError": FINAL,
           "JoinError": RETRY, "GenericError": RETRY, "BaseError": RETRY}


def test_every_obstore_error_class():
    exceptions = pytest.importorskip("obstore.exceptions")
    names = {name for name, cls in vars(exceptions).items() if inspect.isclass(cls) and issubclass(cls, Exception)}
    assert names == set(OBSTORE)
    for name, verdict in OBSTORE.items():
        assert classify(getattr(exceptions, name)("injected")) == verdict, name
    generic = exceptions.GenericError
    assert classify(generic("Server returned non-2xx status code: 503 Service Unavailable: SlowDown")) == RETRY
    assert classify(generic("Server returned non-2xx status code: 400 Bad Request")) == FINAL
    assert classify(generic("Server returned non-2xx status code: 416 Range Not Satisfiable")) == UNSATISFIABLE
    assert classify(generic("HTTP error: error sending request: connection refused")) == RETRY
    assert classify(exceptions.NotSupportedError("Range request not supported by blob")) == NO_RANGE


@pytest.mark.parametrize("status", range(400, 600))
def test_every_http_status(status):
    expected = (MISSING if status in (404, 410) else DENIED if status in (401, 403) else
                PRECONDITION if status == 412 else UNSATISFIABLE if status == 416 else
                RETRY if status in (408, 425, 429) or (status >= 500 and status not in (501, 505)) else FINAL)
    assert classify(_HttpStatus(status, "x")) == expected


# --- through each transport's fake ---------------------------------------------------------------------

def _attempts_of(transport, error, monkeypatch, tmp_path) -> tuple[int, RemoteStoreError | None]:
    """Read through ``Store`` with ``transport`` raising ``error`` every time: (attempts, final error)."""
    store = Store(parse_url("s3://bucket/ds"), RemoteOptions(cache_dir=str(tmp_path), retries=3, backoff_s=0.001),
                  transport=transport)
    try:
        store.read_range("shards/x.pks", 0, 10)
    except RemoteStoreError as exc:
        return store.requests, exc
    return store.requests, None


class _FakeS3FS:
    """Stands for s3fs's filesystem under ``FsspecTransport``: every coroutine raises ``error``."""

    async_impl = True

    def __init__(self, error: BaseException) -> None:
        import fsspec.asyn

        self.error = error
        self.loop = fsspec.asyn.get_loop()

    async def _cat_file(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise self.error


class _FakeObstore:
    """Stands for the obstore module under ``ObstoreTransport``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def get_range(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise self.error


def _fsspec_transport(error):
    transport = FsspecTransport.__new__(FsspecTransport)
    transport.fs, transport.protocol, transport.timeout, transport._root, transport.conditional = (
        _FakeS3FS(error), "s3", 5.0, "bucket", True)
    return transport


def _obstore_transport(error):
    from packer.remote.store import ObstoreTransport

    transport = ObstoreTransport.__new__(ObstoreTransport)
    transport._obstore, transport.store, transport.conditional = _FakeObstore(error), object(), True
    return transport


def _cases():
    cases = [("fsspec", lambda: _s3_error("SlowDown", 503), RETRY),
             ("fsspec", lambda: _s3_error("InternalError", 500), RETRY),
             ("fsspec", lambda: _s3_error("AccessDenied", 403), DENIED),
             ("fsspec", lambda: _s3_error("NoSuchKey", 404), MISSING),
             ("fsspec", lambda: _s3_error("InvalidArgument", 400), FINAL),
             ("fsspec", lambda: __import__("botocore.exceptions").exceptions.NoCredentialsError(), FINAL),
             ("fsspec", lambda: __import__("botocore.exceptions").exceptions.EndpointConnectionError(
                 endpoint_url="http://127.0.0.1:9"), RETRY),
             ("fsspec", lambda: __import__("aiohttp").ClientPayloadError("cut"), RETRY),
             ("fsspec", lambda: TimeoutError(), RETRY)]
    try:
        import obstore.exceptions as ox  # noqa: F401
    except ImportError:
        return cases
    cases += [("obstore", lambda: __import__("obstore.exceptions").exceptions.GenericError(
                  "Server returned non-2xx status code: 503 Service Unavailable"), RETRY),
              ("obstore", lambda: __import__("obstore.exceptions").exceptions.GenericError(
                  "HTTP error: error sending request"), RETRY),
              ("obstore", lambda: __import__("obstore.exceptions").exceptions.PermissionDeniedError("no"), DENIED),
              ("obstore", lambda: __import__("obstore.exceptions").exceptions.NotFoundError("gone"), MISSING),
              ("obstore", lambda: __import__("obstore.exceptions").exceptions.GenericError(
                  "Server returned non-2xx status code: 400 Bad Request"), FINAL)]
    return cases


@pytest.mark.parametrize("case", range(len(_cases())))
def test_each_transport_retries_what_the_table_retries(case, monkeypatch, tmp_path):
    pytest.importorskip("s3fs")
    kind, make, verdict = _cases()[case]
    transport = (_fsspec_transport if kind == "fsspec" else _obstore_transport)(make())
    attempts, error = _attempts_of(transport, make(), monkeypatch, tmp_path)
    assert error is not None
    if verdict == RETRY:
        assert attempts == 3 and "failed after 3 attempts" in error.message, error.message
    else:
        assert attempts == 1 and "not retried" in error.message and error.verdict == verdict, error.message
