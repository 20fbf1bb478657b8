"""An HTTP proxy that breaks some requests on purpose, between a client and a real server.

Every ``every``-th request (counting from 1, all connections together) gets a fault, the
kinds taken in turn from ``kinds``:

- ``reset``: the connection is closed with a TCP RST, no response;
- ``503``: ``503 SlowDown``, as S3 says when throttling;
- ``429``: ``429 Too Many Requests``;
- ``stall``: no response for ``stall_s`` seconds (longer than the client's timeout), then
  the connection is closed;
- ``truncate``: the real response, its ``Content-Length`` intact, but only half its body.

Besides these, a fault may be any answer of :data:`ANSWERS` (never drawn by default): ``500``
(``InternalError``), ``403`` (``AccessDenied``), ``401``; ``bodies`` gives a store's own body
and headers for a status (a GCS or Azure error, not S3's XML).

With ``rate`` (and ``seed``) the faults come at random instead: each request is broken with
probability ``rate``, its kind drawn from ``kinds``, and a ``429`` or ``503`` comes as a burst
of ``burst`` requests in a row, as a throttling store sends them. The draws follow a
generator seeded with ``seed``, so every run injects the same sequence of faults.

With ``only`` (a predicate of method, target and headers), only the requests it accepts
are counted and broken. The rest are forwarded as they are. With ``every``, faults follow a
count, not chance, so a retried request always gets through and every test run sees the same
faults.

A realistic network (:mod:`shaping`), ``every=0`` for it alone: ``link`` delays the first
byte of every answer and paces response bodies per connection and for all connections
together; ``throttle`` answers ``503 SlowDown`` above a request rate, as S3 does; ``delay_s``
is ``link=Link(latency_s=delay_s)``. ``traffic`` counts requests by kind, throttled answers,
bytes and requests in flight.

Everything is bounded: each connection's loop ends when either side closes it, a stall, a
delay or a paced body ends at ``stop()``, and ``stop()`` closes every connection and waits
for the threads that served them.

>>> with FaultProxy(("127.0.0.1", s3.port), every=10) as proxy:
...     ds = tidal.Dataset("s3://bucket/web", storage_options=s3.options(proxy.endpoint))
...     proxy.faults                            # {"reset": 3, "503": 3, ...}
>>> link = Link(latency_s=0.08, conn_bytes_s=50e6, link_bytes_s=100e6)
>>> with FaultProxy(("127.0.0.1", s3.port), every=0, link=link, throttle=Throttle(rps=20)) as proxy:
...     ...
...     proxy.traffic.snapshot()               # {"requests": {"GET range": 40, "LIST": 1}, "throttled": 6, ...}
"""

from __future__ import annotations

import contextlib
import http.client
import io
import random
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from shaping import CHUNK, Bucket, Link, Throttle, Traffic, kind

KINDS = ("reset", "503", "429", "stall", "truncate")
ANSWERS = ("503", "429", "500", "403", "401")  # faults that are an answer: a status and its body
_REASONS = {503: "Service Unavailable", 429: "Too Many Requests", 500: "Internal Server Error"}
_REASONS.update({403: "Forbidden", 401: "Unauthorized"})
_BODIES = {
    503: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>",
    429: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>TooManyRequests</Code>"
    b"<Message>Too many requests.</Message></Error>",
    500: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
    b"<Message>We encountered an internal error. Please try again.</Message></Error>",
    403: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
    b"<Message>Access Denied</Message></Error>",
    401: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>Unauthorized</Code>"
    b"<Message>Authentication required.</Message></Error>",
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
        pace = [b for b in (proxy.link.connection(), proxy._link_bucket) if b is not None]
        try:
            while not proxy._stopping.is_set():
                request = _read_request(rfile, sock)
                if request is None:
                    return
                method, target, headers, body = request
                token = proxy.traffic.begin(kind(method, target, headers), len(body))
                try:
                    if not self._answer(proxy, sock, rfile, upstream, pace, request):
                        return
                finally:
                    proxy.traffic.end(token)
        except OSError:
            return
        finally:
            rfile.close()
            upstream.close()
            proxy._track(sock, False)

    def _answer(
        self,
        proxy: FaultProxy,
        sock: socket.socket,
        rfile: Any,
        upstream: http.client.HTTPConnection,
        pace: list[Bucket],
        request: tuple[str, str, list[tuple[str, str]], bytes],
    ) -> bool:
        """Answer one request; False when the connection is to be closed."""
        method, target, headers, body = request
        start = time.monotonic()
        fault = proxy._next_fault(method, target, headers)
        if fault == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            rfile.close()
            sock.close()  # with a zero linger: RST, not FIN
            return False
        if fault == "stall":
            proxy._stopping.wait(proxy.stall_s)
            return False
        if proxy.link.latency_s and proxy._stopping.wait(proxy.link.latency_s):
            return False  # the time to the first byte of every answer, spent; or the proxy stops
        if fault in ANSWERS:
            status = int(fault)
            headers, answer = proxy.bodies.get(status, ([("Content-Type", "application/xml")], _BODIES[status]))
            _send(sock, status, headers, answer, method)
            return True
        if proxy.throttle is not None and not proxy.throttle.admit(target):
            proxy.traffic.throttle()
            _send(sock, 503, [("Content-Type", "application/xml")], _BODIES[503], method)
            return True
        upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for k, v in headers:
            upstream.putheader(k, v)
        upstream.endheaders(body or None)
        resp = upstream.getresponse()
        out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
        if method == "HEAD":
            out += [(k, v) for k, v in resp.getheaders() if k.lower() == "content-length"]
        if resp.length is None:  # chunked: read whole, sent with its length
            whole = resp.read()
            read: Callable[[int], bytes] = io.BytesIO(whole).read
            length = len(whole)
        else:
            read, length = resp.read, resp.length
        head = f"HTTP/1.1 {resp.status} {resp.reason}\r\n".encode()
        head += b"".join(f"{k}: {v}\r\n".encode() for k, v in out)
        if method != "HEAD":
            head += f"Content-Length: {length}\r\n".encode()
        if fault == "truncate" and length:
            sock.sendall(head + b"Connection: close\r\n\r\n")
            proxy._stream(sock, read, length // 2, pace)  # its Content-Length intact, half its body
            return False
        sock.sendall(head + b"\r\n")
        proxy._stream(sock, read, length, pace)
        resp.read()  # nothing left; the upstream connection is ready for the next request
        if proxy.slow_s is not None and time.monotonic() - start > proxy.slow_s:
            proxy._count_slow()  # the client may have given up on it: a retry no fault caused
        return True


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
    with a timeout near it retries some of them though no fault was injected). ``link``,
    ``throttle`` and ``traffic``: see :mod:`shaping`.
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
        link: Link | None = None,
        throttle: Throttle | None = None,
        bodies: dict[int, tuple[list[tuple[str, str]], bytes]] | None = None,
    ):
        unknown = set(kinds) - set(KINDS) - set(ANSWERS)
        if unknown:
            raise ValueError(f"unknown faults: {unknown}")
        if delay_s and link is not None:
            raise ValueError("delay_s is a link's latency: give one of delay_s and link")
        self.upstream, self.every, self.kinds, self.stall_s, self.only = upstream, every, kinds, stall_s, only
        self.link = link if link is not None else Link(latency_s=delay_s)
        self.throttle = throttle
        self.bodies = bodies or {}  # per status: the headers and body of a store's own answer
        self.traffic = Traffic()
        self._link_bucket = self.link.bucket()
        self.rate, self.burst = rate, burst
        self._rng = random.Random(seed)
        self._burst: list[str] = []  # the rest of a burst under way
        self.faults: Counter[str] = Counter()
        self.requests = 0
        self.slow_s, self.slow = slow_s, 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._open: dict[socket.socket, threading.Thread] = {}
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
                self._open[sock] = threading.current_thread()
            else:
                self._open.pop(sock, None)

    def _stream(self, sock: socket.socket, read: Callable[[int], bytes], n: int, pace: list[Bucket]) -> None:
        """``n`` bytes of ``read`` to ``sock``, a chunk at a time, each when every bucket of
        ``pace`` allows it."""
        while n > 0:
            chunk = read(min(CHUNK, n))
            if not chunk:
                raise OSError("the server's answer ended early")
            wait = max((b.reserve(len(chunk)) for b in pace), default=0.0)
            if wait > 0 and self._stopping.wait(wait):
                raise OSError("the proxy stops")
            self.traffic.sent(len(chunk))  # counted first: a client that has the bytes finds them counted
            sock.sendall(chunk)
            n -= len(chunk)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening, close every connection, and wait up to ``timeout`` for their threads."""
        self._stopping.set()
        self._server.shutdown()
        with self._lock:
            open_now = dict(self._open)
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        deadline = time.monotonic() + timeout
        for thread in [self._thread, *open_now.values()]:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Requests:
    """Every request through the proxy: (method, path, query, range header). An ``only`` that breaks none."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str | None]] = []
        self._lock = threading.Lock()

    def __call__(self, method: str, target: str, headers: list[tuple[str, str]]) -> bool:
        path, _, query = target.partition("?")
        ranged = next((v for k, v in headers if k.lower() == "range"), None)
        with self._lock:
            self.seen.append((method, path, query, ranged))
        return False  # counted here, never broken

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()

    def lists(self) -> int:
        return sum(
            m == "GET" and ("list-type" in q or q.startswith("prefix") or "delimiter" in q) for m, _, q, _ in self.seen
        )

    def heads(self) -> int:
        return sum(m == "HEAD" for m, *_ in self.seen)

    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, *_ in self.seen if m in ("PUT", "POST", "DELETE")]

    def gets(self, suffix: str) -> list[tuple[str, str | None]]:
        return [(p, r) for m, p, q, r in self.seen if m == "GET" and p.endswith(suffix) and "list-type" not in q]
