"""An HTTP proxy that breaks some requests on purpose, between a client and a real server.

Every ``every``-th request (counting from 1, all connections together) gets a fault, the
kinds taken in turn from ``kinds``:

- ``reset``: the connection is closed with a TCP RST, no response;
- ``503``: ``503 SlowDown``, as S3 says when throttling;
- ``429``: ``429 Too Many Requests``;
- ``stall``: no response for ``stall_s`` seconds (longer than the client's timeout), then
  the connection is closed;
- ``truncate``: the real response, its ``Content-Length`` intact, but only half its body.

With ``rate`` (and ``seed``) the faults come at random instead: each request is broken with
probability ``rate``, its kind drawn from ``kinds``, and a ``429`` or ``503`` comes as a burst
of ``burst`` requests in a row, as a throttling store sends them. The draws follow a
generator seeded with ``seed``, so every run injects the same sequence of faults.

With ``only`` (a predicate of method, target and headers), only the requests it accepts
are counted and broken. The rest are forwarded as they are, after ``delay_s`` seconds (a
slow network, to see what prefetching hides). With ``every``, faults follow a count, not
chance, so a retried request always gets through and every test run sees the same faults. Everything is bounded:
each connection's loop ends when either side closes it, a stall ends at ``stall_s`` or at
``stop()``, and ``stop()`` closes every connection.

>>> with FaultProxy(("127.0.0.1", s3.port), every=10) as proxy:
...     ds = tidal.Dataset("s3://bucket/web", storage_options=s3.options(proxy.endpoint))
...     proxy.faults                            # {"reset": 3, "503": 3, ...}
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

KINDS = ("reset", "503", "429", "stall", "truncate")
_REASONS = {503: "Service Unavailable", 429: "Too Many Requests"}
_BODIES = {
    503: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>",
    429: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>TooManyRequests</Code>"
    b"<Message>Too many requests.</Message></Error>",
}
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        proxy = self.server.proxy
        sock: socket.socket = self.request
        proxy._track(sock, True)
        upstream = http.client.HTTPConnection(*proxy.upstream, timeout=30)
        rfile = sock.makefile("rb")
        try:
            while not proxy._stopping.is_set():
                request = _read_request(rfile, sock)
                if request is None:
                    return
                method, target, headers, body = request
                start = time.monotonic()
                fault = proxy._next_fault(method, target, headers)
                if fault == "reset":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    rfile.close()
                    sock.close()  # with a zero linger: RST, not FIN
                    return
                if fault in ("503", "429"):
                    status = int(fault)
                    _send(sock, status, [("Content-Type", "application/xml")], _BODIES[status], method)
                    continue
                if fault == "stall":
                    proxy._stopping.wait(proxy.stall_s)
                    return
                if proxy.delay_s:
                    proxy._stopping.wait(proxy.delay_s)
                upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for k, v in headers:
                    upstream.putheader(k, v)
                upstream.endheaders(body or None)
                resp = upstream.getresponse()
                data = resp.read()
                if proxy.slow_s is not None and time.monotonic() - start > proxy.slow_s:
                    proxy._count_slow()  # the client may have given up on it: a retry no fault caused
                out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
                if method == "HEAD":
                    out += [(k, v) for k, v in resp.getheaders() if k.lower() == "content-length"]
                if fault == "truncate" and data:
                    head = f"HTTP/1.1 {resp.status} {resp.reason}\r\n".encode()
                    head += b"".join(f"{k}: {v}\r\n".encode() for k, v in out)
                    head += f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                    sock.sendall(head + data[: len(data) // 2])
                    return
                _send(sock, resp.status, out, data, method, reason=resp.reason)
        except OSError:
            return
        finally:
            rfile.close()
            upstream.close()
            proxy._track(sock, False)


def _read_request(
    rfile: Any, sock: socket.socket | None = None
) -> tuple[str, str, list[tuple[str, str]], bytes] | None:
    """One request; a client that asks to be told to go on (``Expect: 100-continue``, as botocore
    does before a PUT's body) is told so, and the header is not passed on."""
    line = rfile.readline(65537)
    if not line or not line.strip():
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: list[tuple[str, str]] = []
    length = 0
    for _ in range(200):
        h = rfile.readline(65537).decode("latin-1")
        if h in ("\r\n", "\n", ""):
            break
        k, _, v = h.partition(":")
        k, v = k.strip(), v.strip()
        if k.lower() == "content-length":
            length = int(v)
        if k.lower() == "transfer-encoding":
            raise OSError("chunked request bodies are not supported by this proxy")
        if k.lower() == "expect" and v.lower() == "100-continue":
            if sock is not None:
                sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            continue
        headers.append((k, v))
    body = rfile.read(length) if length else b""
    return method, target, headers, body


def _send(
    sock: socket.socket, status: int, headers: list[tuple[str, str]], body: bytes, method: str, reason: str = ""
) -> None:
    head = f"HTTP/1.1 {status} {reason or _REASONS.get(status, 'OK')}\r\n".encode()
    head += b"".join(f"{k}: {v}\r\n".encode() for k, v in headers)
    if method != "HEAD":
        head += f"Content-Length: {len(body)}\r\n".encode()
    sock.sendall(head + b"\r\n" + (body if method != "HEAD" else b""))


class FaultProxy:
    """A proxy on ``127.0.0.1:<free port>`` to ``upstream`` that breaks every ``every``-th request.

    ``every=0`` forwards everything. ``faults`` counts the faults injected by kind,
    ``requests`` the requests counted (every one, or those ``only`` accepts), ``slow`` the
    requests the server took longer than ``slow_s`` to answer (on a loaded machine, a client
    with a timeout near it retries some of them though no fault was injected).
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        every: int = 10,
        kinds: tuple[str, ...] = KINDS,
        stall_s: float = 3.0,
        only: Callable[[str, str, list[tuple[str, str]]], bool] | None = None,
        delay_s: float = 0.0,
        rate: float = 0.0,
        seed: int = 0,
        burst: int = 1,
        slow_s: float | None = None,
    ):
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown faults: {unknown}")
        self.upstream, self.every, self.kinds, self.stall_s, self.only = upstream, every, kinds, stall_s, only
        self.delay_s = delay_s
        self.rate, self.burst = rate, burst
        self._rng = random.Random(seed)
        self._burst: list[str] = []  # the rest of a burst under way
        self.faults: Counter[str] = Counter()
        self.requests = 0
        self.slow_s, self.slow = slow_s, 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._open: set[socket.socket] = set()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def _next_fault(self, method: str, target: str, headers: list[tuple[str, str]]) -> str | None:
        if self.only is not None and not self.only(method, target, headers):
            return None
        with self._lock:
            self.requests += 1
            n = self.requests
            if self._burst:
                kind = self._burst.pop()
            elif self.rate:
                if self._rng.random() >= self.rate:
                    return None
                kind = self._rng.choice(self.kinds)
                if kind in ("429", "503"):
                    self._burst = [kind] * (self.burst - 1)
            elif not self.every or n % self.every:
                return None
            else:
                kind = self.kinds[(n // self.every - 1) % len(self.kinds)]
            if kind == "truncate" and method == "HEAD":
                kind = "reset"  # a HEAD has no body to cut
            self.faults[kind] += 1
            return kind

    def _count_slow(self) -> None:
        with self._lock:
            self.slow += 1

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._open.add(sock)
            else:
                self._open.discard(sock)

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
