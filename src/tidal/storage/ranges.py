"""What the answer to a ranged GET says, and what it says of the server that gave it.

A server answers ``GET`` with ``Range: bytes=a-b`` with the range (``206``) or, where it ignores
``Range`` (Python's ``http.server`` and many static servers do), with the whole object (``200``).
:func:`answered` tells the two apart, and from anything else: a body shorter than asked for is
:class:`~tidal.storage.retry.Truncated` (tried again), one longer than asked for and not the whole
object as listed is :class:`RangeIgnored` (the object changed, or the server sends something
else). What each server did is remembered per process, by scheme and host, so that the files of a
server that ignores ranges are read whole, in one GET each (:func:`ignored`, :func:`honoured`).
"""

from __future__ import annotations

from tidal.storage.retry import Truncated


class RangeIgnored(ValueError):
    """A ranged GET answered with a body that is neither the range nor the whole object."""


# per process, by scheme and host: True once a ranged GET was answered with the range alone,
# False once one was answered with the whole object (the server ignores Range)
_RANGES: dict[str, bool] = {}


def _host(url: str) -> str:
    """``scheme://host[:port]`` of a URL: what answers its requests."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def answered(url: str, data: bytes, start: int | None, end: int | None, size: int | None) -> tuple[int, bytes]:
    """``(offset, data)`` of the body a GET of bytes ``[start, end)`` of ``url`` (or of all ``size``
    of them) was answered with: the range at ``start``, or the whole object at 0 from a server
    that ignores ``Range`` (remembered); a body that is neither raises."""
    expect = end - start if start is not None and end is not None else size
    host = _host(url)
    if start is not None and end is not None and len(data) > end - start:
        if (size is not None and len(data) != size) or len(data) < end:
            raise RangeIgnored(
                "the server answered a ranged GET with more than was asked, and not the whole object "
                "as listed: it changed since it was listed, or the server sends something else"
            )
        _RANGES[host] = False  # a 200: the whole object, more than the range asked for
        return 0, bytes(data)
    if expect is not None and len(data) != expect:
        raise Truncated(f"got {len(data):,} bytes of {expect:,}")
    if start is not None and end is not None and (start > 0 or (size is not None and end < size)):
        _RANGES.setdefault(host, True)  # exactly the part asked for, less than the whole
    return start or 0, bytes(data)


def ignored(url: str) -> bool:
    """Whether the server of ``url`` answered a ranged GET of this process with the whole object."""
    return _RANGES.get(_host(url)) is False


def honoured(url: str) -> bool:
    """Whether the server of ``url`` answered a ranged GET of this process with only the range."""
    return _RANGES.get(_host(url)) is True
