"""URLs and local paths: which is which, and the root above several. No I/O, no filesystem object."""

from __future__ import annotations

import os

_LOCAL = {"file", "local"}


def protocol(src: str | os.PathLike) -> str | None:
    """The URL scheme of ``src`` (``"s3"``, ``"https"``), or None for a local path."""
    if not isinstance(src, str) or "://" not in src:
        return None
    scheme = src.split("://", 1)[0].lower()
    if not scheme.replace("+", "").replace("-", "").isalnum():
        return None
    return None if scheme in _LOCAL else scheme


def is_remote(src: str | os.PathLike) -> bool:
    """Whether ``src`` is a URL that fsspec reaches over the network (not a local path or ``file://``)."""
    return protocol(src) is not None


def local_path(src: str | os.PathLike) -> str:
    """A local path, with a ``file://`` prefix removed."""
    s = os.fspath(src)
    for prefix in ("file://", "local://"):
        if s.lower().startswith(prefix):
            return s[len(prefix) :]
    return s


def url_root(urls: list[str]) -> str:
    """The longest directory URL above every one of ``urls``.

    >>> url_root(["s3://b/web/a.jsonl", "s3://b/web/x/c.jsonl"])
    's3://b/web'
    """
    parts = [u.split("/")[:-1] for u in urls]
    common = parts[0]
    for p in parts[1:]:
        n = 0
        while n < min(len(common), len(p)) and common[n] == p[n]:
            n += 1
        common = common[:n]
    return "/".join(common)
