"""A local S3 server for tests and benchmarks: moto's server on 127.0.0.1 behind a seeded fault proxy.

Run as a process (``python scripts/loopback_s3.py``): it prints one JSON line with the two
endpoints, then serves until stdin closes. Everything binds to 127.0.0.1 and the proxy only ever
connects to the moto port on 127.0.0.1: nothing here reaches another address.

The proxy forwards every request to moto and, for the requests it is told to touch, injects
faults drawn from a seeded generator: a reset connection, a 500, a 503 SlowDown, a 429, a
truncated body (the full Content-Length announced, part sent, the connection closed), a slow
response, a *trickle* (the headers at once, then the body one byte every ``trickle_s`` seconds:
a socket timeout never fires) and a *mutated* answer (``mutate``: a seeded change to the status,
headers or body of the real answer, for the remote-server fuzzer: bytes flipped or zeroed, a body
cut or extended with its Content-Length to match, a 200 with the whole object to a range request,
a Content-Range dropped or lying, an error status). The manifest is spared unless
``spare_manifest`` is false. It can also add latency to every request and cap the bandwidth of all responses
together (a token bucket shared by every connection), so that a loopback server behaves like a
remote store. ``POST /__proxy__/config`` (JSON) changes the settings; ``GET /__proxy__/log``
returns the requests seen since the last ``POST /__proxy__/reset``.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOOPBACK = "127.0.0.1"
FAULTS = ("reset", "500", "503", "429", "truncate", "slow", "trickle", "mutate")
#: What a ``mutate`` fault does to an answer (drawn per request).
MUTATIONS = ("flip", "zero", "cut", "extend", "whole", "no-content-range", "lying-content-range", "status")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


class ProxyState:
    """The proxy's settings and request log (shared by its handler threads)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.lock = threading.Lock()
        self.config: dict[str, Any] = {"fault_rate": 0.0, "faults": list(FAULTS[:6]), "methods": ["GET"],
                                       "seed": 0, "latency_s": 0.0, "bandwidth": 0, "slow_s": 0.3,
                                       "trickle_s": 0.5, "spare_manifest": True, "paths": None}
        self.rng = random.Random(0)
        self.log: list[dict[str, Any]] = []
        self.next_free = 0.0

    def configure(self, changes: dict[str, Any]) -> None:
        with self.lock:
            self.config.update(changes)
            if "seed" in changes:
                self.rng = random.Random(int(changes["seed"]))

    def draw(self, method: str, path: str) -> str | None:
        with self.lock:
            config = self.config
            if method not in config["methods"] or config["fault_rate"] <= 0:
                return None
            if config["spare_manifest"] and path.split("?")[0].endswith("manifest.json"):
                return None
            if config["paths"] is not None and not any(part in path for part in config["paths"]):
                return None
            if self.rng.random() >= config["fault_rate"]:
                return None
            return self.rng.choice(config["faults"])

    def mutation(self) -> tuple[str, random.Random]:
        """A mutation kind and a generator for its details (both from the seeded stream)."""
        with self.lock:
            return self.rng.choice(MUTATIONS), random.Random(self.rng.randrange(1 << 32))

    def throttle(self, nbytes: int) -> None:
        """A shared link of ``bandwidth`` bytes/s: wait for this chunk's turn on it."""
        rate = self.config["bandwidth"]
        if not rate or nbytes <= 0:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + nbytes / rate
            wait = self.next_free - now
        if wait > 0:
            time.sleep(wait)


def make_handler(state: ProxyState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _control(self) -> None:
            body = self._body()
            if self.path == "/__proxy__/config":
                state.configure(json.loads(body or b"{}"))
                out = json.dumps(state.config).encode()
            elif self.path == "/__proxy__/reset":
                with state.lock:
                    state.log = []
                out = b"{}"
            else:
                with state.lock:
                    out = json.dumps(state.log).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def _forward(self) -> None:
            if self.path.startswith("/__proxy__/"):
                return self._control()
            body = self._body()
            fault = state.draw(self.command, self.path)
            entry = {"method": self.command, "path": self.path.split("?")[0], "range": self.headers.get("Range"),
                     "fault": fault, "time": time.time()}
            if state.config["latency_s"]:
                time.sleep(state.config["latency_s"])
            if fault == "reset":
                with state.lock:
                    state.log.append(entry)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.close_connection = True
                self.connection.close()
                return
            if fault in ("500", "503", "429"):
                with state.lock:
                    state.log.append(entry)
                code = {"500": (500, "InternalError"), "503": (503, "SlowDown"), "429": (429, "TooManyRequests")}[fault]
                out = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code[1]}</Code>"
                       f"<Message>injected</Message></Error>").encode()
                self.send_response(code[0])
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return
            upstream = http.client.HTTPConnection(LOOPBACK, state.upstream_port, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                entry["status"] = response.status
                entry["bytes"] = len(data)
                with state.lock:
                    state.log.append(entry)
                if fault == "slow":
                    time.sleep(state.config["slow_s"])
                status, headers_out = response.status, [(k, v) for k, v in response.getheaders()
                                                        if k.lower() not in _HOP and k.lower() != "content-length"]
                if fault == "mutate" and self.command == "GET":
                    status, headers_out, data = self._mutate(entry, status, headers_out, data, headers, upstream)
                self.send_response(status)
                for key, value in headers_out:
                    self.send_header(key, value)
                # a HEAD answer has no body but announces the object's length
                length = response.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command == "HEAD":
                    return
                if fault == "trickle":
                    for k in range(len(data)):
                        self.wfile.write(data[k:k + 1])
                        self.wfile.flush()
                        time.sleep(state.config["trickle_s"])
                    return
                if fault == "truncate" and len(data) > 1:
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                view = memoryview(data)
                for pos in range(0, len(data), 256 << 10):
                    piece = view[pos:pos + (256 << 10)]
                    state.throttle(len(piece))
                    self.wfile.write(piece)
            finally:
                upstream.close()

        def _mutate(self, entry: dict[str, Any], status: int, headers: list[tuple[str, str]], data: bytes,
                    request_headers: dict[str, str], upstream: http.client.HTTPConnection
                    ) -> tuple[int, list[tuple[str, str]], bytes]:
            """One seeded change to a real answer (``MUTATIONS``); recorded in the log entry."""
            kind, rng = state.mutation()
            entry["mutation"] = kind
            if kind == "flip" and data:
                body = bytearray(data)
                for _ in range(rng.randint(1, 4)):
                    body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
                data = bytes(body)
            elif kind == "zero" and data:
                start = rng.randrange(len(data))
                data = data[:start] + bytes(len(data) - start)
            elif kind == "cut":
                data = data[:rng.randrange(len(data) + 1)]
            elif kind == "extend":
                data = data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))
            elif kind == "whole" and "Range" in request_headers:  # as python -m http.server answers
                whole = {k: v for k, v in request_headers.items() if k != "Range"}
                upstream.request("GET", self.path, headers=whole)
                answer = upstream.getresponse()
                data = answer.read()
                status = answer.status
                headers = [(k, v) for k, v in answer.getheaders()
                           if k.lower() not in _HOP and k.lower() not in ("content-length", "content-range")]
            elif kind == "no-content-range":
                headers = [(k, v) for k, v in headers if k.lower() != "content-range"]
            elif kind == "lying-content-range":
                headers = [(k, v) if k.lower() != "content-range" else
                           (k, f"bytes {rng.randrange(1 << 20)}-{rng.randrange(1 << 20, 1 << 21)}/{rng.randrange(1 << 22)}")
                           for k, v in headers]
            elif kind == "status":
                status = rng.choice([400, 403, 404, 409, 412, 416, 500, 502, 503])
                data = b"<?xml version=\"1.0\"?><Error><Code>Injected</Code></Error>"
                headers = [("Content-Type", "application/xml")]
            return status, headers, data

        def _serve(self) -> None:
            try:
                self._forward()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up on a slow or truncated answer

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

    return Handler


def start(port: int = 0) -> dict[str, Any]:
    """Start moto and the proxy in this process (threads); returns endpoints and stoppers."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)
    moto.start()
    _host, moto_port = moto.get_host_and_port()
    state = ProxyState(moto_port)
    proxy = ThreadingHTTPServer((LOOPBACK, 0), make_handler(state))
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True, name="loopback-s3-proxy").start()
    return {"direct": f"http://{LOOPBACK}:{moto_port}", "proxy": f"http://{LOOPBACK}:{proxy.server_address[1]}",
            "stop": lambda: (proxy.shutdown(), moto.stop())}


def main() -> None:
    servers = start()
    print(json.dumps({"direct": servers["direct"], "proxy": servers["proxy"]}), flush=True)
    sys.stdin.read()  # serve until the parent closes our stdin (or exits)
    servers["stop"]()


if __name__ == "__main__":
    main()
