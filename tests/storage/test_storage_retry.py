"""Which errors are retried, how long between tries, and what the final error says."""

from __future__ import annotations

import random
import time

import pytest

from tidal.errors import StorageError
from tidal.storage import Retry, Storage, parse_size
from tidal.storage.retry import Truncated, call, describe, redact, throttled, transient
from tidal.storage.stats import Stats


class ClientError(Exception):
    """Shaped like botocore's: a response dict with an error code and an HTTP status."""

    def __init__(self, code: str, status: int):
        super().__init__(f"An error occurred ({code}) when calling the GetObject operation")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class ClientPayloadError(Exception):
    """Named like aiohttp's: a body cut short."""


def wrapped(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as e:
        return e


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError(),
        Truncated("got 10 bytes of 20"),
        ClientPayloadError("Response payload is not completed"),
        ClientError("SlowDown", 503),
        ClientError("Throttling", 400),
        ClientError("TooManyRequests", 429),
        ClientError("InternalError", 500),
        wrapped(ClientError("SlowDown", 503), OSError(16, "Please reduce your request rate")),
        Exception("Server returned non-2xx status code: 503 Service Unavailable"),
        Exception("HTTP error: request or response body error"),
        # obstore, when the server is down: the duration is not a status code
        Exception(
            "Generic S3 error: Error performing GET http://127.0.0.1:43115/b/k in 400.771µs - HTTP error: error sending request"
        ),
    ],
)
def test_transient_errors_are_retried(exc: BaseException) -> None:
    assert transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError("s3://b/k"),
        PermissionError("denied"),
        ClientError("NoSuchKey", 404),
        ClientError("AccessDenied", 403),
        wrapped(ClientError("NoSuchKey", 404), FileNotFoundError("b/k")),
        ValueError("bad argument"),
        Exception("Error performing GET http://127.0.0.1:9/b/k in 503.2ms - Server returned non-2xx status code: 403."),
    ],
)
def test_permanent_errors_are_not(exc: BaseException) -> None:
    assert not transient(exc)


def test_backoff_grows_exponentially_with_full_jitter_and_a_cap() -> None:
    r, rng = Retry(attempts=10, backoff=0.5, max_backoff=4.0), random.Random(0)
    for attempt in range(10):
        waits = [r.delay(attempt, rng) for _ in range(300)]
        cap = min(4.0, 0.5 * 2**attempt)
        assert min(waits) >= 0 and max(waits) <= cap
        assert max(waits) > 0.8 * cap and min(waits) < 0.2 * cap  # jitter spreads over the whole range


def test_call_retries_then_names_the_url_attempts_and_last_error() -> None:
    stats, tries = Stats(), []

    def flaky() -> bytes:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionResetError(104, "Connection reset by peer")
        return b"ok"

    fast = Retry(attempts=4, backoff=0.001)
    assert call(flaky, url="s3://b/k", what="GET", retry=fast, stats=stats) == b"ok"
    assert stats.dict()["retries"] == 2

    def down() -> bytes:
        raise ClientError("InternalError", 500)

    with pytest.raises(StorageError) as err:
        call(down, url="s3://b/k", what="GET bytes 0-10", retry=fast, stats=stats)
    assert str(err.value).startswith("s3://b/k: GET bytes 0-10 failed 4 times in ")
    assert "InternalError" in str(err.value) and err.value.attempts == 4
    with pytest.raises(StorageError, match=r"s3://b/k: GET failed: .*NoSuchKey") as err:
        call(lambda: (_ for _ in ()).throw(ClientError("NoSuchKey", 404)), url="s3://b/k", what="GET", retry=fast)
    assert err.value.attempts == 1  # not retried


def test_errors_never_show_credentials() -> None:
    text = (
        "GET https://user:hunter2@host/b/k?X-Amz-Signature=abc123&X-Amz-Credential=AKIA failed; "
        "secret_access_key='wJalrXUtnFEMI' token=FwoGZXIvYXdz"
    )
    clean = redact(text)
    for secret in ("hunter2", "abc123", "AKIA", "wJalrXUtnFEMI", "FwoGZXIvYXdz"):
        assert secret not in clean
    assert "https://host/b/k" in clean
    settings = Storage(options={"key": "AKIA", "secret": "wJalrXUtnFEMI"})
    assert "wJalrXUtnFEMI" not in repr(settings) and "AKIA" not in repr(settings)


def test_a_store_that_throttles_is_tried_for_throttled_s_whatever_the_attempts() -> None:
    stats, tries = Stats(), []

    def busy() -> bytes:
        tries.append(1)
        if len(tries) < 12:  # more tries than attempts allows
            raise ClientError("SlowDown", 503) if len(tries) % 2 else ClientError("TooManyRequests", 429)
        return b"ok"

    patient = Retry(attempts=3, backoff=0.001, max_backoff=0.002, throttled_s=30)
    assert call(busy, url="s3://b/k", what="GET", retry=patient, stats=stats) == b"ok"
    assert stats.dict()["retries"] == 11

    def always() -> bytes:
        raise ClientError("SlowDown", 503)

    with pytest.raises(StorageError, match=r"kept throttling it for 0.05s \(Retry.throttled_s\)") as err:
        call(always, url="s3://b/k", what="GET", retry=Retry(attempts=3, backoff=0.001, throttled_s=0.05))
    assert err.value.attempts > 3
    with pytest.raises(StorageError, match="failed 3 times"):  # throttled_s=0: a throttled try is any try
        call(always, url="s3://b/k", what="GET", retry=Retry(attempts=3, backoff=0.001, throttled_s=0))
    reset = 0

    def mixed() -> bytes:  # throttled answers do not use up the attempts; resets do
        nonlocal reset
        reset += 1
        raise ClientError("SlowDown", 503) if reset % 3 else ConnectionResetError(104, "reset")

    with pytest.raises(StorageError, match=r"failed 9 times .*reset"):
        call(mixed, url="s3://b/k", what="GET", retry=Retry(attempts=3, backoff=0.001, throttled_s=30))
    assert reset == 9  # the third reset ends it, after six throttled answers


def test_the_throttled_time_counts_from_the_first_throttled_answer_not_from_a_slow_first_try() -> None:
    """A first request slow to come back (a client starting in a new DataLoader worker) used up
    a short throttled_s before the store had said a word: it failed once, with no retry."""
    stats, tries = Stats(), []

    def slow_then_throttled() -> bytes:
        tries.append(1)
        if len(tries) == 1:
            time.sleep(0.2)
        raise ClientError("SlowDown", 503)

    with pytest.raises(StorageError, match="kept throttling"):
        call(slow_then_throttled, url="s3://b/k", what="GET", retry=Retry(backoff=0.001, throttled_s=0.1), stats=stats)
    assert len(tries) > 1 and stats.dict()["retries"] == len(tries) - 1


def test_azure_server_busy_is_throttling() -> None:
    busy = wrapped(ConnectionError("x"), Exception("The server is busy.\nErrorCode:ServerBusy"))
    assert throttled(busy) and transient(busy)


def test_a_check_of_each_failed_try_may_end_the_tries_with_what_the_failure_means() -> None:
    """The fetcher's check: a body cut short because the object was replaced is said so at once,
    not retried as a flaky network; a check that lets the error be goes on with the tries."""
    stats, seen = Stats(), []

    def cut() -> bytes:
        raise Truncated("got 882 bytes of 17,321")

    def replaced(exc: BaseException) -> None:
        seen.append(exc)
        raise StorageError("s3://b/k changed since the dataset was listed", url="s3://b/k", permanent=True)

    with pytest.raises(StorageError, match="changed since the dataset was listed"):
        call(cut, url="s3://b/k", what="GET", retry=Retry(attempts=4, backoff=0.001), stats=stats, check=replaced)
    assert len(seen) == 1 and isinstance(seen[0], Truncated) and stats.dict()["retries"] == 0
    seen.clear()
    with pytest.raises(StorageError, match="failed 4 times"):
        call(cut, url="s3://b/k", what="GET", retry=Retry(attempts=4, backoff=0.001), stats=stats, check=seen.append)
    assert len(seen) == 4 and stats.dict()["retries"] == 3  # the request that failed for good: 3 retries counted


def test_obstore_says_why_a_request_could_not_be_sent_only_in_its_debug_output() -> None:
    text = (
        "Generic S3 error: Error performing GET http://127.0.0.1:42957/b/x in 530.26µs - HTTP error: error "
        'sending request\n\nDebug source:\nGeneric {\n    store: "S3",\n    source: RetryError(\n        '
        'ConnectError(\n    "tcp connect error",\n    Os {\n        code: 111,\n        kind: ConnectionRefused,'
        '\n        message: "Connection refused",\n    },\n    ),\n}'
    )
    said = describe(Exception(text))
    assert said.endswith("error sending request (ConnectionRefused: Connection refused)") and "Debug" not in said


def test_sizes_are_read_as_people_write_them() -> None:
    assert parse_size("50GB") == 50 * 10**9
    assert parse_size("1.5 TB") == 1_500_000_000_000
    assert parse_size("512MiB") == 512 << 20
    assert parse_size(1234) == 1234
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")
    assert Storage(cache_limit="2GB").limit == 2 * 10**9


def test_gcs_and_azure_errors_are_judged_by_their_status() -> None:
    """The real exception classes of gcsfs and azure-core, as those clients raise them."""
    import aiohttp
    import requests
    from azure.core.exceptions import (
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )
    from gcsfs.retry import HttpError

    class Response:  # what azure-core reads off a response to make its error
        def __init__(self, status: int):
            self.status_code, self.reason, self.headers = status, "reason", {}

        def text(self) -> str:
            return ""

    refused = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("127.0.0.1", 9, False, True, None, None, None),
        ConnectionRefusedError(111, "Connect call failed"),
    )
    for exc in [
        HttpError({"code": 503, "message": "Service Unavailable"}),
        HttpError({"code": 429, "message": "rate limit exceeded"}),
        HttpError({"code": 500, "message": "backend error"}),
        requests.exceptions.ProxyError(),  # gcsfs's 502 Bad Gateway
        refused,
        ServiceRequestError("Cannot connect to host 127.0.0.1:9", error=refused),
        ServiceResponseError("Connection closed before the response"),
        HttpResponseError(response=Response(503)),
        HttpResponseError(response=Response(500)),
    ]:
        assert transient(exc), repr(exc)
    for exc in [
        HttpError({"code": 404, "message": "No such object"}),
        HttpError({"code": 403, "message": "Forbidden"}),
        HttpError({"code": 401, "message": "Login Required"}),
        OSError("Forbidden: b/k\naccess denied"),  # gcsfs's 403 of a GET
        ResourceNotFoundError(response=Response(404)),
        HttpResponseError(response=Response(403)),
    ]:
        assert not transient(exc), repr(exc)
