"""The shaping proxy itself (tests/shaping.py through tests/fault_proxy.py), in front of moto's S3
server: latency, bandwidth per connection and per link, 503 SlowDown above a request rate, its
counters, and its stop. Times are checked only from below (a link can be slower than asked on a
busy machine, never faster); the buckets and the throttle are checked on a clock of their own."""

from __future__ import annotations

import http.client
import os
import threading
import time

import pytest
from fault_proxy import FaultProxy
from s3_server import KEY, REGION, SECRET, S3Server
from shaping import CHUNK, Bucket, Link, Throttle, kind, window

pytest_plugins = ["s3_fixtures"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def signed(endpoint: str, path: str, method: str = "GET") -> str:
    """``/bucket/key`` with the query string of a presigned request (moto refuses anonymous ones)."""
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION
    )
    bucket, key = path.lstrip("/").split("/", 1)
    op = {"GET": "get_object", "HEAD": "head_object"}[method]
    url = client.generate_presigned_url(op, Params={"Bucket": bucket, "Key": key}, ExpiresIn=600)
    return url.removeprefix(endpoint)


def get(endpoint: str, path: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, signed(endpoint, path, method), headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_bucket_gives_its_burst_at_once_then_its_rate() -> None:
    clock = Clock()
    b = Bucket(rate=10, burst=2, clock=clock)
    assert [b.take(), b.take(), b.take()] == [True, True, False]  # a refused take costs nothing
    clock.now += 0.1
    assert [b.take(), b.take()] == [True, False]
    paced = Bucket(rate=100, burst=10, clock=clock)
    assert paced.reserve(10) == 0.0  # the burst, at once
    assert paced.reserve(50) == pytest.approx(0.5)  # then 100 a second
    assert paced.reserve(50) == pytest.approx(1.0)  # reservations queue up
    clock.now += 10
    assert paced.reserve(10) == 0.0  # idle: full again, never fuller


def test_a_throttle_keeps_one_budget_per_prefix_or_one_for_all() -> None:
    clock = Clock()
    per = Throttle(rps=1, burst=2, per_prefix=1, clock=clock)
    assert per.prefix("/bench/jsonl/part-0.jsonl?x-id=GetObject") == "bench/jsonl"
    assert per.prefix("/bench?list-type=2&prefix=jsonl%2Fpart") == "bench/jsonl"
    assert [per.admit("/bench/jsonl/a") for _ in range(3)] == [True, True, False]
    assert per.admit("/bench/mds/a")  # another prefix: a budget of its own
    clock.now += 1.0
    assert [per.admit("/bench/jsonl/b"), per.admit("/bench/jsonl/b")] == [True, False]
    shared = Throttle(rps=1, burst=2, clock=clock)
    assert [shared.admit("/bench/jsonl/a"), shared.admit("/bench/mds/a"), shared.admit("/other/x")] == [
        True,
        True,
        False,
    ]


def test_requests_are_counted_by_kind() -> None:
    assert kind("GET", "/b/k.parquet", [("Range", "bytes=0-9")]) == "GET range"
    assert kind("GET", "/b/dir/k.jsonl", []) == "GET"
    assert kind("GET", "/b?list-type=2&prefix=dir", []) == "LIST"
    assert kind("GET", "/b/", []) == "LIST"
    assert kind("HEAD", "/b/k", []) == "HEAD"
    assert kind("PUT", "/b/k", []) == "PUT"


def test_the_link_delays_every_answer_by_its_latency(s3: S3Server, bucket: str) -> None:
    s3.put(bucket, "small", b"x" * 100)
    with FaultProxy(("127.0.0.1", s3.port), every=0, link=Link(latency_s=0.1)) as proxy:
        t0 = time.monotonic()
        for _ in range(5):
            assert get(proxy.endpoint, f"/{bucket}/small") == (200, b"x" * 100)
        elapsed = time.monotonic() - t0
        assert proxy.traffic.snapshot()["requests"] == {"GET": 5}
    assert elapsed >= 5 * 0.1


def test_a_connection_moves_no_faster_than_its_cap(s3: S3Server, bucket: str) -> None:
    body = os.urandom(2_000_000)
    s3.put(bucket, "big", body)
    cap = 4e6
    with FaultProxy(("127.0.0.1", s3.port), every=0, link=Link(conn_bytes_s=cap)) as proxy:
        before = proxy.traffic.snapshot()
        t0 = time.monotonic()
        status, got = get(proxy.endpoint, f"/{bucket}/big")
        elapsed = time.monotonic() - t0
        status_range, part = get(proxy.endpoint, f"/{bucket}/big", headers={"Range": "bytes=100-199"})
        moved = window(before, proxy.traffic.snapshot())
    assert (status, got) == (200, body)  # every byte, in order
    assert (status_range, part) == (206, body[100:200])
    assert elapsed >= (len(body) - CHUNK) / cap  # 0.47 s at least; 2 ms unpaced
    assert moved["requests"] == {"GET": 1, "GET range": 1}
    assert moved["bytes_out"] == len(body) + 100


def test_connections_together_move_no_faster_than_the_link(s3: S3Server, bucket: str) -> None:
    body = os.urandom(1_000_000)
    s3.put(bucket, "part", body)
    link = Link(conn_bytes_s=10e6, link_bytes_s=2.5e6)  # three connections could move 30 MB/s; the link 2.5
    got: list[tuple[int, bytes]] = []
    start = threading.Barrier(3)

    def one() -> None:
        start.wait()
        got.append(get(proxy.endpoint, f"/{bucket}/part"))

    with FaultProxy(("127.0.0.1", s3.port), every=0, link=link) as proxy:
        threads = [threading.Thread(target=one) for _ in range(3)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - t0
    traffic = proxy.traffic.snapshot()  # once stopped: every request has ended
    assert got == [(200, body)] * 3
    assert elapsed >= (3 * len(body) - CHUNK) / link.link_bytes_s  # 1.15 s at least: the link, not 3 connections
    assert traffic["peak_in_flight"] == 3 and traffic["in_flight"] == 0
    assert traffic["busy_s"] >= elapsed  # three requests in flight most of the time: 3x the span, less the stagger


def test_above_its_request_rate_the_store_answers_503_slowdown(s3: S3Server, bucket: str) -> None:
    s3.put(bucket, "web/a", b"a")
    s3.put(bucket, "code/b", b"b")
    throttle = Throttle(rps=0.01, burst=2, per_prefix=1)  # one request back every 100 s: none in this test
    with FaultProxy(("127.0.0.1", s3.port), every=0, throttle=throttle) as proxy:
        answers = [get(proxy.endpoint, f"/{bucket}/web/a") for _ in range(4)]
        other = get(proxy.endpoint, f"/{bucket}/code/b")
        head = get(proxy.endpoint, f"/{bucket}/web/a", method="HEAD")
        traffic = proxy.traffic.snapshot()
    assert answers[:2] == [(200, b"a")] * 2
    for status, body in answers[2:]:
        assert status == 503 and b"<Code>SlowDown</Code>" in body  # S3's own error body
    assert other == (200, b"b")  # another prefix, another budget
    assert head == (503, b"")
    assert traffic["throttled"] == 3 and traffic["requests"] == {"GET": 5, "HEAD": 1}


def test_stop_ends_a_paced_transfer_and_its_thread(s3: S3Server, bucket: str) -> None:
    body = os.urandom(4_000_000)
    s3.put(bucket, "slow", body)
    proxy = FaultProxy(("127.0.0.1", s3.port), every=0, link=Link(latency_s=0.01, conn_bytes_s=1e6))
    received: list[int] = []
    short: list[int] = []  # bytes the response said it had and did not bring

    def read() -> None:
        host, port = proxy.endpoint.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request("GET", signed(proxy.endpoint, f"/{bucket}/slow"))
            resp = conn.getresponse()
            while chunk := resp.read(CHUNK):
                received.append(len(chunk))
            short.append(resp.length or 0)
        except (OSError, http.client.HTTPException):
            short.append(len(body) - sum(received))
        finally:
            conn.close()

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 30
    while not received and time.monotonic() < deadline:
        time.sleep(0.01)
    assert received, "no byte came through the proxy"
    proxy.stop()  # 4 s of body left at 1 MB/s
    reader.join(30)
    assert not reader.is_alive()
    assert sum(received) < len(body) and short == [len(body) - sum(received)]  # cut short, and the client knows it
    assert not proxy._open and not proxy._thread.is_alive()  # every connection's thread has ended
    assert proxy.traffic.snapshot()["in_flight"] == 0
