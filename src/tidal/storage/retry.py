"""Retries of remote requests: which errors are worth another try, and how long to wait.

Object stores fail in passing all the time: a connection reset, a 503 ``SlowDown``, a 429,
a read that stalls, a body cut short. Each request tidal makes goes through :func:`call`,
which retries such errors with exponential backoff and full jitter (a random wait in
``[0, min(max_backoff, backoff * 2**attempt)]``, so clients that failed together do not
retry together) and gives up at once on errors that another try cannot fix (not found,
access denied). When it gives up, the :class:`~tidal.errors.StorageError` names the URL,
the attempts, the time spent and the last error, with credentials removed.

Errors are recognised by type *name* and status code (botocore's ``response``, aiohttp's
``status``, azure-core's ``status_code``, gcsfs's ``HttpError.code``), walking ``__cause__``
and ``__context__``, so no client library (botocore, aiohttp, obstore, gcsfs, azure-core) is
imported to check.
The clients' own retry loops are turned off where tidal builds them (see
:mod:`tidal.storage.fs`), so the counts in the stats are the real ones.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tidal.errors import ArgumentError, MissingDependency, StorageError
from tidal.storage.stats import Stats

T = TypeVar("T")

_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_TRANSIENT_NAMES = {
    # python, urllib3, http.client
    "IncompleteRead",
    "RemoteDisconnected",
    "ProtocolError",
    "ReadTimeoutError",
    "NewConnectionError",
    # aiohttp
    "ClientPayloadError",
    "ServerDisconnectedError",
    "ClientConnectionError",
    "ClientConnectorError",
    "ClientOSError",
    "ServerTimeoutError",
    "ConnectionTimeoutError",
    "SocketTimeoutError",
    "ContentLengthError",
    "TransferEncodingError",
    # botocore
    "ConnectTimeoutError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "IncompleteReadError",
    "ResponseStreamingError",
    "HTTPClientError",
    "ResponseParserError",
    # azure-core (adlfs): no response, or a response cut short
    "ServiceRequestError",
    "ServiceRequestTimeoutError",
    "ServiceResponseError",
    "ServiceResponseTimeoutError",
    # requests, as gcsfs raises a 502 Bad Gateway
    "ProxyError",
    # fsspec, tidal
    "FSTimeoutError",
    "Truncated",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestLimitExceeded",
    "TooManyRequests",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "RequestTimeoutException",
    "BandwidthLimitExceeded",
    "EC2ThrottledException",
}
_PERMANENT_CODES = {"NoSuchKey", "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "404"}
# last resort, for clients that only say it in words (obstore, gcsfs, adlfs)
_TRANSIENT_TEXT = re.compile(
    r"(?<![\d.])(?:429|500|502|503|504)(?!\.?\d|\s*[µm]?s\b)|SlowDown|[Tt]hrottl|[Tt]oo [Mm]any [Rr]equests|timed? ?out|[Tt]imeout"
    r"|reset by peer|[Cc]onnection (?:reset|closed|aborted|refused)|[Bb]roken pipe|temporarily unavailable"
    r"|[Ss]ervice [Uu]navailable|error sending request|error decoding response body|IncompleteRead"
    r"|end of file before message length|[Pp]ayload|body error|UnexpectedEof|IncompleteBody|Interrupted"
    r"|error trying to connect|[Cc]onnection error"
)
# a status code, not a duration: obstore writes "in 400.771µs"
_PERMANENT_TEXT = re.compile(
    r"(?<![\d.])(?:400|401|403|404|416)(?!\.?\d|\s*[µm]?s\b)|[Nn]ot [Ff]ound|NoSuchKey|AccessDenied|[Ff]orbidden"
)


class Truncated(OSError):
    """A response shorter than it said it was: retried like a reset connection."""


@dataclass(frozen=True)
class Retry:
    """How a failed request is retried.

    >>> Retry(attempts=10, backoff=0.5)      # more patient than the default

    ``attempts`` counts every try, the first included. Wait ``i`` (from 0) is uniform in
    ``[0, min(max_backoff, backoff * 2**i)]`` seconds.

    A store that says it is *throttling* (429, ``SlowDown``, ``Throttling``...) is up and asks
    for fewer requests: such answers do not use up ``attempts``; the request is tried again,
    with the same backoff, for up to ``throttled_s`` seconds from the first such answer. So a
    job under sustained throttling slows down rather than fails. ``throttled_s=0``: a throttled
    try counts as any other.
    """

    attempts: int = 8
    backoff: float = 0.25
    max_backoff: float = 20.0
    throttled_s: float = 300.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.backoff < 0 or self.max_backoff < 0 or self.throttled_s < 0:
            raise ArgumentError("attempts must be at least 1, and backoffs and throttled_s at least 0")

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))


_rng = random.Random()  # jitter only: never decides anything about the data


def transient(exc: BaseException) -> bool:
    """Whether another try of the request that raised ``exc`` may succeed."""
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and len(seen) < 8 and not any(e is s for s in seen):
        seen.append(e)
        verdict = _judge(e)
        if verdict is not None:
            return verdict
        e = e.__cause__ or e.__context__
    text = " ".join(str(s) for s in seen)
    if _PERMANENT_TEXT.search(text):
        return False
    return bool(_TRANSIENT_TEXT.search(text))


_THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestLimitExceeded",
    "TooManyRequests",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "BandwidthLimitExceeded",
    "EC2ThrottledException",
    "ServerBusy",  # Azure Storage's 503 when an account or partition is over its targets
}
_THROTTLE_TEXT = re.compile(
    r"SlowDown|[Tt]hrottl|[Tt]oo [Mm]any [Rr]equests|(?<![\d.])429(?![\d.])|rateLimitExceeded|ServerBusy"
)


def throttled(exc: BaseException) -> bool:
    """Whether the store answered that it is throttling (429, ``SlowDown``...): up, and asking for
    fewer requests, which is worth more patience than a store that does not answer."""
    for e in _chain(exc):
        code, status = code_and_status(e)
        if status == 429 or code in _THROTTLE_CODES:
            return True
    return bool(_THROTTLE_TEXT.search(" ".join(str(e) for e in _chain(exc))))


def _judge(e: BaseException) -> bool | None:
    """True or False when ``e`` alone decides; None to look further down the chain."""
    name = type(e).__name__
    if name in _TRANSIENT_NAMES:
        return True
    code, status = code_and_status(e)
    if status in (501, 505):  # Not Implemented (a PUT to a read-only web server), HTTP Version: never another try
        return False
    if code in _TRANSIENT_CODES or status in (408, 429) or (status is not None and status >= 500):
        return True
    if code in _PERMANENT_CODES or (status is not None and 400 <= status < 500):
        return False
    if isinstance(e, (TimeoutError, ConnectionError)):
        return True
    if isinstance(e, _PERMANENT) and e.__cause__ is None:
        return False
    return None


def code_and_status(e: BaseException) -> tuple[str | None, int | None]:
    response = getattr(e, "response", None)  # botocore ClientError
    if isinstance(response, dict):
        err = response.get("Error", {})
        meta = response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode")
        return err.get("Code"), int(status) if status is not None else None
    status = getattr(e, "status", None) or getattr(e, "status_code", None) or getattr(e, "code", None)
    return None, status if isinstance(status, int) else None


def call(
    fn: Callable[[], T],
    *,
    url: str,
    what: str,
    retry: Retry,
    stats: Stats | None = None,
    check: Callable[[BaseException], None] | None = None,
) -> T:
    """``fn()``, retried on transient errors; a :class:`StorageError` naming ``url`` when it gives up.

    ``check(error)`` sees each failed try's error first and may raise a :class:`StorageError`
    that says what it means instead (a body cut short because the object was replaced): that
    ends the tries at once, as no other try could help. ``stats`` counts every retry, those
    of a request whose tries run out included (8 tries: 7 retries).

    >>> data = call(lambda: fs.cat_file(path), url=url, what="GET", retry=Retry())
    """
    start = time.monotonic()
    url = redact(url)  # a signed URL's query string is a credential
    tries = failures = 0  # failures: the tries that use up attempts (not throttled ones)
    throttled_at: float | None = None  # the first answer that the store is throttling
    while True:
        try:
            return fn()
        except (StorageError, MissingDependency):  # a package not installed: no try can help, nor is it the store's
            raise
        except Exception as exc:
            tries += 1
            if check is not None:
                check(exc)
            if not transient(exc):
                raise StorageError(
                    f"{url}: {what} failed: {describe(exc)}", url=url, attempts=tries, permanent=True
                ) from _clean(exc)
            took = time.monotonic() - start
            if throttled(exc) and retry.throttled_s > 0:
                now = time.monotonic()
                throttled_at = now if throttled_at is None else throttled_at
                over = (
                    now - throttled_at >= retry.throttled_s
                )  # a slow first try (a client starting) is not the store's
                why = f"the store kept throttling it for {retry.throttled_s:g}s (Retry.throttled_s)"
            else:
                failures += 1
                over = failures >= retry.attempts
                why = "transient errors, retried with backoff"
            if over:
                raise StorageError(
                    f"{url}: {what} failed {tries} times in {took:.1f}s ({why}); last error: {describe(exc)}",
                    url=url,
                    attempts=tries,
                ) from _clean(exc)
            if stats is not None:
                stats.add(retries=1)
            time.sleep(retry.delay(min(tries - 1, 32), _rng))


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and len(out) < 8 and not any(e is s for s in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def describe(exc: BaseException) -> str:
    """``Type: message`` of an error and of its root cause, with credentials and signed query strings removed."""
    text = f"{type(exc).__name__}: {str(exc) or repr(exc)}"
    root, depth = exc, 0
    while (root.__cause__ or root.__context__) is not None and depth < 8:
        root, depth = root.__cause__ or root.__context__, depth + 1  # type: ignore[assignment]
    if root is not exc and str(root) and str(root) not in text:
        text += f" (from {type(root).__name__}: {root})"
    status = next((st for e in _chain(exc) if (st := code_and_status(e)[1]) is not None), None)
    if status is not None and f"{status}" not in text:
        text = f"HTTP {status}, {text}"  # what a person searches for; some clients leave it out
    text, _, debug = text.partition("\n\nDebug source:")  # obstore appends pages of debug output
    found = _OS_ERROR.search(debug)  # and says only there why a request could not be sent
    if found is not None and found["message"] not in text:
        text += f" ({found['kind']}: {found['message']})"
    return redact(text)[:600]


# in obstore's debug output, the system's error under a request that failed: "kind: ConnectionRefused,
# message: "Connection refused""
_OS_ERROR = re.compile(r'kind: (?P<kind>\w+),\s*message: "(?P<message>[^"]{1,200})"')


_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_QUERY = re.compile(r"(https?://[^\s?'\"]+)\?[^\s'\"]*")
# a field that holds a secret, by its name; what is hidden is its value, never the words around it
_NAME = r"[\w-]*(?:secret|token|password|passwd|signature|credential|key|sig|sas)[\w-]*"
_VALUE = r"""(?P<value>b?"[^"]*"|b?'[^']*'|[^\s,;'"&}<>]+)"""
_ASSIGNED = re.compile(rf"(?i)(?P<name>{_NAME}['\"]?\s*=\s*){_VALUE}")  # key=value: queries, connection strings
_QUOTED = re.compile(rf"(?i)(?P<name>['\"]{_NAME}['\"]\s*:\s*){_VALUE}")  # 'key': value: a dict's or JSON's text
_COLON = re.compile(rf"(?i)(?<![\w-])(?P<name>{_NAME}\s*:\s*){_VALUE}")  # key: value, a header's or YAML's
# ``NoSuchKey: The specified key...``, ``KeyError: 'x'``: an error's type before its message, not a field
_TYPE_NAME = re.compile(r"[A-Z][a-z0-9]*(?:[A-Z]+[a-z0-9]*)+\s*:\s*")
# secrets known by their shape wherever they stand: AWS access key ids, Hub, GitHub and Google OAuth tokens
_SHAPED = re.compile(
    r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA|ANVA|APKA)[A-Z0-9]{16}\b|\bhf_[A-Za-z0-9]{20,}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}\b|\bya29\.[\w.-]+"
)
# a token after its scheme: an Authorization header's (any scheme), a bearer token anywhere
_BEARER = re.compile(
    r"(?i:(?P<lead>authorization['\"]?\s*[:=]\s*b?['\"]?(?:bearer|basic|token)\s+))[A-Za-z0-9._~+/=-]+"
    r"|(?<=\bBearer )[A-Za-z0-9._~+/=-]{16,}"
)


def _hidden(match: re.Match[str]) -> str:
    """A field with its value replaced, the value's quotes kept."""
    value = match["value"]
    quote = value[:2] if value[:2] in ("b'", 'b"') else value[:1] if value[:1] in "'\"" else ""
    return f"{match['name']}{quote}<redacted>{quote[-1:] if quote else ''}"


def _field(match: re.Match[str]) -> str:
    return match[0] if _TYPE_NAME.fullmatch(match["name"]) else _hidden(match)


def redact(text: str) -> str:
    """``text`` without ``user:password@`` in URLs, query strings (signatures), the values of
    fields that name a secret (``secret=...``, ``'token': ...``, ``x-amz-security-token: ...``),
    bearer tokens and access key ids; the words around them are left as they are.

    >>> redact("NoCredentialsError: Unable to locate credentials; token=FwoGZX")
    'NoCredentialsError: Unable to locate credentials; token=<redacted>'
    """
    text = _ASSIGNED.sub(_hidden, redact_urls(text))
    text = _COLON.sub(_field, _QUOTED.sub(_hidden, text))
    return _BEARER.sub(_scheme, _SHAPED.sub("<redacted>", text))


def _scheme(match: re.Match[str]) -> str:
    return (match["lead"] or "") + "<redacted>"


def redact_urls(text: str) -> str:
    """``text`` without ``user:password@`` in URLs or the query strings of http(s) URLs (signatures)."""
    return _QUERY.sub(r"\1?<redacted>", _USERINFO.sub("", text))


def _clean(exc: BaseException) -> BaseException | None:
    """The cause to chain: kept when its text holds nothing to hide, else dropped."""
    return exc if redact(str(exc)) == str(exc) else None
