"""How a dataset reaches remote shards and where it keeps them: one frozen, picklable value.

A :class:`Storage` travels inside the read plan into every DataLoader worker, so it holds
only plain data: no filesystem object, no open file, no thread. Each process builds its
own clients from it (see :mod:`tidal.storage.fs`), which is what keeps forked workers safe.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tidal import env
from tidal.errors import ArgumentError
from tidal.storage.retry import Retry
from tidal.storage.urls import is_remote, url_root

DEFAULT_CACHE_LIMIT = 50 * 10**9
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40})


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string such as ``"50GB"``, ``"1.5 TB"`` or ``"512MiB"``.

    >>> parse_size("50GB")
    50000000000
    """
    if isinstance(size, int):
        if size < 0:
            raise ArgumentError(f"a size cannot be negative: {size}")
        return size
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(size))
    unit = m.group(2).upper() if m else ""
    if m is None or unit not in _UNITS:
        raise ArgumentError(f"not a size: {size!r} (try '50GB', '512MiB' or a number of bytes)")
    return int(float(m.group(1)) * _UNITS[unit])


def default_cache_dir() -> Path:
    """``$TIDAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/tidal``, else ``~/.cache/tidal``."""
    return env.cache_dir()


@dataclass(frozen=True)
class Storage:
    """Where remote shards come from and how they are kept on local disk.

    >>> Storage(options={"endpoint_url": "http://127.0.0.1:9000"}, cache_limit="20GB")

    - ``options``: fsspec ``storage_options`` for the URL's filesystem (credentials,
      endpoint, ...). They are passed through as they are, never printed.
    - ``cache_dir``: the shard cache; by default ``<tidal cache dir>/shards/<key>``, keyed
      by the dataset's root URL. Any number of processes and datasets may share one.
    - ``cache_limit``: bytes (or ``"50GB"``) the cache may hold on disk; least recently used
      shards that no reader holds are evicted to stay under it.
    - ``timeout``: seconds one request may take before it is abandoned and retried.
    - ``retry``: how often and how patiently transient errors are retried.
    - ``prefetch``: how many upcoming shards each reader downloads ahead of itself.
    - ``part_size`` / ``parallel``: a shard is fetched as ranged GETs of ``part_size``
      bytes, ``parallel`` of them at a time.
    - ``verify``: hash every download, and re-hash a cached shard the first time a process
      opens it. By default a download is hashed when the index has a hash to check it
      against, and a cached shard's size and modification time are checked on every open.
    - ``backend``: ``"auto"``, or force ``"s3fs"`` / ``"obstore"`` for reading ``s3://``
      shard data (see :mod:`tidal.storage.fs` for what ``"auto"`` picks and why).
    - ``index_url``: where the dataset's index is published (:mod:`tidal.sources.published`); by
      default ``.tidal-index.json`` in the directory the source names. A job reads it first,
      and a complete one is its listing.
    - ``publish_index``: whether a job that had to count files publishes what it counted
      there, for the other nodes and the next jobs (where the store lets it). Off by default: a
      job writes to the data's location only when asked (``tidal index``, or this); its own
      counts are shared between its ranks through the process group and kept in the shard cache.
    """

    options: dict[str, Any] = field(default_factory=dict, compare=False)
    cache_dir: str | None = None
    cache_limit: int | str = DEFAULT_CACHE_LIMIT
    timeout: float = 60.0
    retry: Retry = field(default_factory=Retry)
    prefetch: int = 8
    part_size: int = 16 << 20
    parallel: int = 4
    verify: bool = False
    backend: str = "auto"
    index_url: str | None = None
    publish_index: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_limit", parse_size(self.cache_limit))
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.path.abspath(os.path.expanduser(os.fspath(self.cache_dir))))
        if self.backend not in ("auto", "s3fs", "obstore"):
            raise ArgumentError(f"backend must be 'auto', 's3fs' or 'obstore', not {self.backend!r}")
        if self.timeout <= 0 or self.prefetch < 0 or self.part_size < 1 or self.parallel < 1:
            raise ArgumentError("timeout, part_size and parallel must be positive and prefetch at least 0")

    @property
    def limit(self) -> int:
        assert isinstance(self.cache_limit, int)
        return self.cache_limit

    @property
    def root(self) -> Path:
        """The directory of the shard cache."""
        return Path(self.cache_dir) if self.cache_dir is not None else default_cache_dir() / "shards" / "common"

    def for_files(self, files: Iterable[str]) -> Storage:
        """These settings, with the default cache directory of a dataset of ``files`` filled in."""

        urls = [f for f in files if is_remote(f)]
        if self.cache_dir is not None or not urls:
            return self
        key = hashlib.sha1(url_root(urls).encode()).hexdigest()[:16]
        return replace(self, cache_dir=str(default_cache_dir() / "shards" / key))

    def to_config(self, files: Iterable[str]) -> dict:
        """These settings as plain data for a pipeline config (:mod:`tidal.config`): the options
        without credentials (``storage_options_removed`` names what was left out), the cache, and
        whatever else differs from the defaults. ``files``: the dataset's, for its default cache."""
        options, removed = public_options(self.options)
        default = Storage()
        out: dict[str, Any] = {"storage_options": options}
        if self.cache_dir != replace(self, cache_dir=None).for_files(files).cache_dir:
            out["cache_dir"] = self.cache_dir
        if self.cache_limit != default.cache_limit:
            out["cache_limit"] = self.cache_limit
        names = ("timeout", "prefetch", "part_size", "parallel", "verify", "backend", "index_url", "publish_index")
        settings: dict[str, Any] = {n: getattr(self, n) for n in names if getattr(self, n) != getattr(default, n)}
        if self.retry != default.retry:
            settings["retry"] = asdict(self.retry)
        if settings:
            out["storage"] = settings
        if removed:
            out["storage_options_removed"] = removed
        return out

    def __repr__(self) -> str:  # options may hold credentials: name the keys only
        keys = ", ".join(sorted(self.options))
        return (
            f"Storage(options=<{keys or 'none'}>, cache_dir={self.cache_dir!r}, cache_limit={self.cache_limit}, "
            f"timeout={self.timeout}, retry={self.retry}, prefetch={self.prefetch})"
        )


_SECRET = re.compile(
    r"(?i)^(key|secret|token|password|passwd|authorization|cookie|credentials?|sas|profile_secret)$"
    r"|secret|password|token|access_key|account_key|private_key|api_key|credential|connection_string"
)


_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")  # user:password@ in a URL
_QUERY = re.compile(r"^(https?://[^?]+)\?.*$")  # a signed URL's query string


def public_source(src: str | list[str]) -> tuple[str | list[str], bool]:
    """``src`` without the credentials a URL may carry (``user:password@``, a signed URL's query
    string), and whether there were any."""
    if isinstance(src, list):
        clean = [_QUERY.sub(r"\1", _USERINFO.sub("", s)) for s in src]
        return clean, clean != src
    one = _QUERY.sub(r"\1", _USERINFO.sub("", src))
    return one, one != src


def public_options(options: dict[str, Any], at: str = "") -> tuple[dict[str, Any], list[str]]:
    """``options`` without credentials (``key``, ``secret``, ``token``, ``password``, the
    ``aws_secret_access_key`` of ``client_kwargs``, ``Authorization`` headers...) and without
    values that are not plain data, and the dotted names of what was left out."""
    kept: dict[str, Any] = {}
    removed: list[str] = []
    for name, value in options.items():
        where = f"{at}{name}"
        if _SECRET.search(str(name)):
            removed.append(where)
        elif isinstance(value, dict):
            kept[name], inner = public_options(value, where + ".")
            removed += inner
        elif _plain(value):
            kept[name] = value
        else:
            removed.append(where)
    return kept, removed


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (list, tuple)) and all(_plain(v) for v in value)
