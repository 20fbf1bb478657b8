"""JSON lines without orjson: the standard library parser gives the same records and errors."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tidal
from tidal.formats import _json

# Lines on which the two parsers could differ: orjson's rules, numbers, strings, nesting.
LINES = [
    b'{"a": 1}', b' {"a": 1}\t', b'{"a":1,"a":2}', b'{"a": -0}', b'{"a": -0.0}', b'{"a": 1.5e-7}', b'{"a": 1E+2}',
    b'{"a": 9007199254740993}', b'{"a": 18446744073709551615}', b'{"a": 18446744073709551616}',
    b'{"a": -9223372036854775808}', b'{"a": -9223372036854775809}', b'{"a": 123456789012345678901234567890}',
    b'{"a": 123456789012345678901234567890.5}', b'{"a": 1' + b"0" * 308 + b"}", b'{"a": 1' + b"0" * 309 + b"}",
    b'{"a": ' + b"7" * 5000 + b"}", b'{"a": 1e400}', b'{"a": -1e400}', b'{"a": 1e-400}', b'{"a": 4.9e-324}',
    b'{"a": 1.7976931348623157e308}', b'{"a": 1.7976931348623159e308}', b'{"a": 2.2250738585072011e-308}',
    b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}', b'{"a": 01}', b'{"a": .5}', b'{"a": 1.}', b'{"a": +1}',
    b'{"a": "\\ud83d\\ude00"}', b'{"a": "\\ud800"}', b'{"\\uDC00": 1}', b'{"a": ["\\ud800\\ud800"]}',
    b'{"a": "\\u0000"}', b'{"a": "\\\\ud800"}', b'{"a": "\xc3\xa9\xe2\x82\xac"}', b'{"a": "\xff"}',
    b'{"a": "\xed\xa0\x80"}', b'\xef\xbb\xbf{"a": 1}', b'\xff\xfe{\x00}\x00', b'{"a": "\t"}', b'{"a": "\x7f"}',
    b'{"a": "\\x"}', b"{'a': 1}", b'{"a": 1,}', b"[1,]", b'{"a": 1} x', b'{"a": 1}\x00', b'\x0c{"a": 1}', b"\r",
    b'{"a": True}', b"[1, 2]", b'"text"', b"null", b"{}",
    b"[" * 1000 + b"]" * 1000, b"[" * 1024 + b"]" * 1024, b"[" * 1025 + b"]" * 1025,
    b'{"a":' * 1024 + b"1" + b"}" * 1024, b'{"a":' * 1025 + b"1" + b"}" * 1025, b'["[[["' + b"]" * 3,
]  # fmt: skip


def _outcome(loads: Any, data: bytes) -> tuple[str, Any]:
    try:
        value = loads(data)
    except ValueError:
        return "error", None
    return "ok", _typed(value)


def _typed(value: Any) -> Any:
    """``value`` with the type of every number kept, so that 1 and 1.0 differ; NaN-free."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, float):
        return ("float", math.copysign(1.0, value), value)
    return (type(value).__name__, value)


def test_fallback_follows_orjsons_rules() -> None:
    loads = _json.loads_stdlib
    assert loads(b'{"a": 18446744073709551615, "b": -9223372036854775809}') == {"a": 2**64 - 1, "b": -(2.0**63)}
    assert isinstance(loads(b'{"a": 123456789012345678901234567890}')["a"], float)
    assert loads(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}
    deep = loads(b"[" * 1024 + b"]" * 1024)
    for _ in range(1023):
        deep = deep[0]
    assert deep == []
    for data, words in [
        (b'{"a": NaN}', "NaN is not valid JSON"),
        (b'{"a": -Infinity}', "-Infinity is not valid JSON"),
        (b'{"a": 1e400}', "number out of range of a double: 1e400"),
        (b'{"a": ' + b"7" * 5000 + b"}", "number out of range of a double"),
        (b'{"a": "\\ud800"}', "lone surrogate \\ud800 in a string"),
        (b'{"a": "\xed\xa0\x80"}', "not UTF-8: invalid continuation byte at byte 7"),
        (b'\xef\xbb\xbf{"a": 1}', "a UTF-8 byte order mark is not JSON"),
        (b"[" * 1025 + b"]" * 1025, "arrays and objects nested more than 1024 deep"),
        (b'{"a": 1,}', "Expecting property name enclosed in double quotes: line 1 column 9 (char 8)"),
    ]:
        with pytest.raises(ValueError, match="^" + re.escape(words)):
            loads(data)


@pytest.fixture
def deep_values() -> Iterator[None]:
    """Room to compare values nested 1,024 deep (the parsers' own limits do not depend on it)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 3000)
    yield
    sys.setrecursionlimit(limit)


@pytest.mark.parametrize("data", LINES, ids=range(len(LINES)))
def test_fallback_accepts_rejects_and_reads_as_orjson(data: bytes, deep_values: None) -> None:
    orjson = pytest.importorskip("orjson")
    assert _outcome(_json.loads_stdlib, data) == _outcome(orjson.loads, data)


_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(_values, st.integers(min_value=0, max_value=200), st.binary(max_size=3))
def test_fallback_agrees_with_orjson_on_generated_lines(value: Any, cut: int, junk: bytes) -> None:
    orjson = pytest.importorskip("orjson")
    text = json.dumps({"v": value}, ensure_ascii=cut % 2 == 0)
    for data in (text.encode(), text.encode()[:cut] + junk + text.encode()[cut:]):
        assert _outcome(_json.loads_stdlib, data) == _outcome(orjson.loads, data)


BAD = [
    b'{"id": 2,,}',
    b"[1, 2]",
    b'{"id": NaN}',
    b'{"id": "\\ud800"}',
    b'{"id": "\xff"}',
    b'{"id": 1e999}',
    b"{'id': 3}",
]


def _read(path: Path, **kwargs: Any) -> list[dict] | str:
    try:
        return list(tidal.Dataset(path, **kwargs))
    except tidal.RecordError as exc:
        return str(exc)


@pytest.mark.parametrize("errors", ["skip", "raise"])
def test_jsonl_without_orjson_gives_the_same_records_and_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errors: str
) -> None:
    pytest.importorskip("orjson")
    good = [b'{"id": %d, "text": "line %d", "n": %d}' % (i, i, 10**i) for i in range(25)]
    files = [good]
    files += [[*good[:5], bad, *good[5:]] for bad in BAD]  # one bad line at line 6 of each file
    for i, lines in enumerate(files):
        (tmp_path / f"f{i}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    for i in range(len(files)):
        path = tmp_path / f"f{i}.jsonl"
        fast = _read(path, errors=errors)
        with monkeypatch.context() as m:
            m.setattr(_json, "loads", _json.loads_stdlib)
            slow = _read(path, errors=errors)
        assert slow == fast
        if errors == "skip" or i == 0:
            assert [r["id"] for r in slow] == list(range(25))
            assert slow[24]["n"] == float(10**24) and isinstance(slow[24]["n"], float)
        else:
            assert isinstance(slow, str) and f"f{i}.jsonl, line 6: malformed JSON record: " in slow
