"""Parsing one JSON line: orjson when it is installed (``tidal[fast]``), the standard library otherwise.

Both parsers accept the same lines, give the same values and explain a bad line in the same
words. The standard library parser here (:func:`loads_stdlib`) is held to orjson's rules:

- the bytes must be UTF-8, with no byte order mark and no surrogates, raw or escaped alone
  (``"\\ud800"``);
- ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON, and neither is a number too large for
  a double (``1e400``);
- an integer outside ``[-2**63, 2**64)`` becomes the nearest float, as orjson gives it;
- arrays and objects nest at most 1,024 deep.

Error messages come from :func:`loads_stdlib` whichever parser found the error
(:func:`reason`), so a file gives the same :class:`tidal.RecordError` with or without orjson.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 1024  # orjson's limit on nested arrays and objects

try:
    import orjson
except ImportError:  # the tests force this path too
    orjson = None  # type: ignore[assignment]

_INF = float("inf")
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_deep = threading.Lock()


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _float(text: str) -> float:
    value = float(text)
    if value == _INF or value == -_INF:
        raise ValueError(f"number out of range of a double: {text[:40]}")
    return value


def _int(text: str) -> int | float:
    digits = len(text) - (text[0] == "-")
    if digits < 19:
        return int(text)
    if digits <= 20:
        value = int(text)
        if -(1 << 63) <= value < (1 << 64):
            return value
    return _float(text)  # as orjson: the nearest double, or an error past its range


_decoder = json.JSONDecoder(parse_float=_float, parse_int=_int, parse_constant=_constant)


def _depth(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (strings do not count)."""
    deepest = depth = 0
    for char in _STRING.sub('""', text):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _check_strings(value: Any) -> None:
    """Reject a lone surrogate (only ``\\u`` escapes can make one here) anywhere in ``value``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                raise ValueError(f"lone surrogate \\u{ord(found.group()):04x} in a string")
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def loads_stdlib(data: bytes | memoryview) -> Any:
    """One JSON document from UTF-8 bytes, with the standard library, by orjson's rules."""
    try:
        text = str(data, "utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    if text.startswith("\ufeff"):
        raise ValueError("a UTF-8 byte order mark is not JSON")
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        raise ValueError(f"arrays and objects nested more than {MAX_DEPTH} deep")
    try:
        value = _decoder.decode(text)
    except RecursionError:  # deep, yet within MAX_DEPTH
        with _deep:  # the recursion limit is the process's: one deep document at a time
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(limit + 2 * MAX_DEPTH)
            try:
                value = _decoder.decode(text)
            finally:
                sys.setrecursionlimit(limit)
    if "\\u" in text:
        _check_strings(value)
    return value


#: The parser :mod:`tidal.formats.jsonl` uses: orjson's ``loads`` when installed.
loads: Callable[[bytes | memoryview], Any] = orjson.loads if orjson is not None else loads_stdlib


def reason(data: bytes | memoryview, exc: ValueError) -> str:
    """Why ``data`` is not JSON, in :func:`loads_stdlib`'s words whichever parser raised ``exc``."""
    try:
        loads_stdlib(data)
    except ValueError as strict:
        return str(strict)
    return str(exc)  # the parsers disagree (a bug): keep the first one's words
