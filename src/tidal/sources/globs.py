"""Globs as regular expressions, matched against paths below a root: by the local listing
(:mod:`tidal.sources.listing`) and against the keys of a published index
(:mod:`tidal.sources.published`), so that both read a glob the same way."""

from __future__ import annotations

import os
import re


def glob_pattern(pattern: str, sep: str = os.sep) -> re.Pattern[str]:
    """A glob below its root as a regex: ``**`` any directories, ``*`` and ``?`` within a name
    (names split by ``sep``: ``"/"`` in URLs)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**" + sep, i):
            out.append(f"(?:[^{sep}]+{sep})*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append(f"[^{sep}]*")
        elif c == "?":
            out.append(f"[^{sep}]")
        elif c == "[" and "]" in pattern[i + 1 :]:
            j = pattern.index("]", i + 2) if pattern[i + 1 : i + 2] == "]" else pattern.index("]", i + 1)
            body = pattern[i + 1 : j]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = j + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))
