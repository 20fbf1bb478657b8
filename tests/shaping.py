"""A model of the network between a loader and an object store, for :class:`fault_proxy.FaultProxy`.

Loopback has no latency and no bandwidth limit; a real store has both, and throttles. Three
pieces, each plain data plus a lock, with the clock passed in so that they can be checked
without sleeping:

- :class:`Link`: what the network does to every response: ``latency_s`` before the first
  byte (the request is forwarded after it), and the body paced by token buckets of
  ``conn_bytes_s`` per connection and ``link_bytes_s`` for all connections together;
- :class:`Throttle`: what the store does above a request rate: a token bucket of ``rps``
  requests a second (``burst`` at once), for all requests together or one per key prefix,
  as S3 partitions them; a request that finds the bucket empty is answered ``503 SlowDown``
  (S3's XML error body) and not forwarded;
- :class:`Traffic`: what went through: requests by kind (``GET``, ``GET range``, ``HEAD``,
  ``LIST``, ``PUT``, ...), ``503 SlowDown`` answers, body bytes each way, requests in flight
  (now, at most, and in total seconds, so that a window's mean is a difference of two
  snapshots).

>>> link = Link(latency_s=0.08, conn_bytes_s=50e6, link_bytes_s=100e6)
>>> with FaultProxy(("127.0.0.1", s3.port), every=0, link=link, throttle=Throttle(rps=20)) as proxy:
...     ...
...     proxy.traffic.snapshot()      # {"GET range": 12, "bytes_out": ..., "503 SlowDown": 3, ...}
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Clock = Callable[[], float]
CHUNK = 128 << 10  # bytes of a response body paced at a time


class Bucket:
    """A token bucket of ``rate`` units a second holding at most ``burst``: :meth:`reserve`
    says how long to wait before using ``n`` units (the generic cell rate algorithm, so a
    reservation never waits on another's sleep). Over any span, at most ``burst + rate * span``
    units pass."""

    def __init__(self, rate: float, burst: float, clock: Clock = time.monotonic):
        if rate <= 0 or burst <= 0:
            raise ValueError(f"a bucket needs a positive rate and burst, not {rate} and {burst}")
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tat = -float("inf")  # theoretical arrival time: when the bucket is full again
        self._lock = threading.Lock()

    def reserve(self, n: float) -> float:
        """Take ``n`` units; the seconds to wait before they may be used (0: at once)."""
        with self._lock:
            now = self._clock()
            self._tat = max(self._tat, now) + n / self.rate
            return max(0.0, self._tat - self.burst / self.rate - now)

    def take(self, n: float = 1.0) -> bool:
        """Take ``n`` units if the bucket has them now; else take nothing and say so."""
        with self._lock:
            now = self._clock()
            tat = max(self._tat, now) + n / self.rate
            if tat - self.burst / self.rate > now + 1e-9:
                return False
            self._tat = tat
            return True


@dataclass(frozen=True)
class Link:
    """Latency before the first byte of every response, and the rate of response bodies.

    ``conn_bytes_s``: each connection's bodies, as a store serves one request; ``link_bytes_s``:
    all connections together, the capacity a loader can fill only with enough requests in
    flight. None: no limit."""

    latency_s: float = 0.0
    conn_bytes_s: float | None = None
    link_bytes_s: float | None = None

    def __post_init__(self) -> None:
        if self.latency_s < 0 or any(r is not None and r <= 0 for r in (self.conn_bytes_s, self.link_bytes_s)):
            raise ValueError(f"latency must be at least 0 and rates positive: {self}")

    def bucket(self, clock: Clock = time.monotonic) -> Bucket | None:
        """The bucket of all connections together (one per proxy)."""
        return None if self.link_bytes_s is None else Bucket(self.link_bytes_s, CHUNK, clock)

    def connection(self, clock: Clock = time.monotonic) -> Bucket | None:
        """The bucket of one connection."""
        return None if self.conn_bytes_s is None else Bucket(self.conn_bytes_s, CHUNK, clock)


@dataclass
class Throttle:
    """``503 SlowDown`` above ``rps`` requests a second (``burst`` at once, one second's worth
    by default), for every request together or, with ``per_prefix=n``, per bucket and first
    ``n`` parts of the key (``/bucket/a/b/c``: ``bucket/a`` for 1), as S3 throttles per prefix."""

    rps: float
    burst: float | None = None
    per_prefix: int | None = None
    clock: Clock = time.monotonic

    def __post_init__(self) -> None:
        if self.rps <= 0:
            raise ValueError(f"a throttle needs a positive rate, not {self.rps}")
        self._buckets: dict[str, Bucket] = {}
        self._lock = threading.Lock()

    def admit(self, target: str) -> bool:
        """Whether a request for ``target`` (the request line's path and query) may pass now."""
        key = self.prefix(target)
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                burst = self.burst if self.burst is not None else max(1.0, self.rps)
                bucket = self._buckets[key] = Bucket(self.rps, burst, self.clock)
        return bucket.take()

    def prefix(self, target: str) -> str:
        """The key a request is throttled under: ``""`` for all together, else bucket and prefix."""
        if self.per_prefix is None:
            return ""
        split = urllib.parse.urlsplit(target)
        bucket, _, key = urllib.parse.unquote(split.path).lstrip("/").partition("/")
        if not key:  # a listing: its prefix= names the keys it reads
            key = urllib.parse.parse_qs(split.query).get("prefix", [""])[0]
        return "/".join([bucket, *key.split("/")[: self.per_prefix]])


def kind(method: str, target: str, headers: list[tuple[str, str]]) -> str:
    """What a request is, as :class:`Traffic` counts it: ``GET range``, ``GET`` (whole), ``LIST``
    (a GET of a bucket, not of a key), ``HEAD``, else the method."""
    if method != "GET":
        return method
    if any(k.lower() == "range" for k, _ in headers):
        return "GET range"
    _, _, key = urllib.parse.urlsplit(target).path.lstrip("/").partition("/")
    return "GET" if key else "LIST"


class Traffic:
    """Counters of a proxy's traffic, thread-safe; :meth:`snapshot` is plain data.

    ``busy_s`` adds up the time each request was in flight (from its request line read to its
    response's last byte sent): over a window, its growth over the window's length is the mean
    number of requests in flight."""

    def __init__(self, clock: Clock = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.throttled = 0  # 503 SlowDown answers of the throttle
        self.bytes_out = 0  # response body bytes sent to clients
        self.bytes_in = 0  # request body bytes received from clients
        self.in_flight = self.peak_in_flight = 0
        self._busy = 0.0
        self._since: dict[int, float] = {}  # start of each request in flight
        self._tokens = itertools.count()

    def begin(self, what: str, body: int) -> int:
        """A request of kind ``what`` starts; its token for :meth:`end`."""
        with self._lock:
            self.requests[what] += 1
            self.bytes_in += body
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            token = next(self._tokens)
            self._since[token] = self._clock()
            return token

    def end(self, token: int) -> None:
        with self._lock:
            start = self._since.pop(token, None)
            if start is not None:
                self.in_flight -= 1
                self._busy += self._clock() - start

    def sent(self, n: int) -> None:
        with self._lock:
            self.bytes_out += n

    def throttle(self) -> None:
        with self._lock:
            self.throttled += 1

    def snapshot(self) -> dict[str, Any]:
        """Every counter now, and the time: ``busy_s`` counts the requests still in flight up to now."""
        with self._lock:
            now = self._clock()
            busy = self._busy + sum(now - t for t in self._since.values())
            return {
                "t": now,
                "requests": dict(self.requests),
                "throttled": self.throttled,
                "bytes_out": self.bytes_out,
                "bytes_in": self.bytes_in,
                "in_flight": self.in_flight,
                "peak_in_flight": self.peak_in_flight,
                "busy_s": busy,
            }


def window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What went through between two snapshots: requests by kind, bytes, mean requests in flight."""
    span = max(after["t"] - before["t"], 1e-9)
    requests = Counter(after["requests"])
    requests.subtract(before["requests"])
    return {
        "seconds": span,
        "requests": {k: v for k, v in requests.items() if v},
        "throttled": after["throttled"] - before["throttled"],
        "bytes_out": after["bytes_out"] - before["bytes_out"],
        "bytes_out_s": (after["bytes_out"] - before["bytes_out"]) / span,
        "mean_in_flight": (after["busy_s"] - before["busy_s"]) / span,
    }
