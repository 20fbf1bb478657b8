"""The destination of a conversion: a local directory or any fsspec URL (``s3://bucket/out``).

Every file appears under its final name in one step, whole or not at all: locally by
``os.replace`` from a temporary file in the same directory tree, remotely by one upload (an
object store shows an object only once its PUT completes). Shards are written to a local
staging directory first (under the destination when it is local, so the rename does not
copy; under the system's temporary directory when it is remote).

>>> out = Output("/data/web-parquet")
>>> out.place(out.staging() / "part-00000.parquet.tmp", "part-00000.parquet")   # {"mtime_ns": ...}
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import tempfile
from pathlib import Path
from typing import Any

from tidal.storage.config import Storage
from tidal.storage.urls import is_remote, local_path

WORK = ".tidal-convert"  # the conversion's own directory under the destination: plan, done markers, staging


class Output:
    """A destination directory: names relative to it, files placed atomically."""

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None):
        self.url = os.fspath(url)
        self.remote = is_remote(self.url)
        self.options = dict(storage_options or {})
        if not self.remote:
            self.root = Path(os.path.abspath(os.path.expanduser(local_path(self.url))))
        self._fs: Any = None

    def __getstate__(self) -> dict:  # a filesystem client is built in each process that uses it
        return {**self.__dict__, "_fs": None}

    def __repr__(self) -> str:
        return f"Output({self.url!r})"

    # -- remote --------------------------------------------------------------------------

    @property
    def fs(self) -> Any:
        """The destination's client, as tidal builds it for reading (its own retries off: ``_call`` retries)."""
        if self._fs is None:
            from tidal.storage.fs import Remote

            remote = Remote(self.url.split("://", 1)[0], Storage(options=self.options))
            self._fs, self._path = remote.fs, remote.path(self.url)
        return self._fs

    def _remote_path(self, name: str) -> str:
        self.fs  # noqa: B018 - sets _path
        return posixpath.join(self._path.rstrip("/"), name)

    def _call(self, what: str, name: str, fn: Any) -> Any:
        from tidal.errors import StorageError
        from tidal.storage.refusals import explain
        from tidal.storage.retry import Retry, call

        url = f"{self.url.rstrip('/')}/{name}"
        try:
            return call(fn, url=url, what=what, retry=Retry())
        except StorageError as exc:  # a refusal said in words (access denied to the bucket...), as for reads
            explained = explain(exc, url, what)
            if explained is exc:
                raise
            raise explained from exc.__cause__

    # -- the few operations a conversion needs -------------------------------------------

    def where(self, name: str) -> str:
        """The full path or URL of ``name``: what messages print."""
        return f"{self.url.rstrip('/')}/{name}" if self.remote else str(self.root / name)

    def staging(self) -> Path:
        """A local directory for files being written (made if missing)."""
        if self.remote:
            key = hashlib.sha1(self.url.encode()).hexdigest()[:16]
            where = Path(tempfile.gettempdir()) / f"tidal-convert-{key}"
        else:
            where = self.root / WORK / "staging"
        where.mkdir(parents=True, exist_ok=True)
        return where

    def place(self, file: Path, name: str) -> dict:
        """Move a finished local ``file`` to ``name``; what identifies this version of it
        (``{"mtime_ns": ...}`` locally, ``{"version": etag}`` remotely, as tidal's index keeps them)."""
        if not self.remote:
            final = self.root / name
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(file, final)
            return {"mtime_ns": final.stat().st_mtime_ns}
        target = self._remote_path(name)
        self._call("PUT", name, lambda: self.fs.put_file(str(file), target))
        file.unlink(missing_ok=True)
        found = self.stat(name)
        return {"version": found[1] if found is not None else None}

    def write_text(self, name: str, text: str) -> None:
        """Write a small file atomically."""
        if self.remote:
            target = self._remote_path(name)
            self._call("PUT", name, lambda: self.fs.pipe_file(target, text.encode()))
            return
        final = self.root / name
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, final)

    def read_text(self, name: str) -> str | None:
        """The content of ``name``, or None where there is no such file."""
        if not self.remote:
            try:
                return (self.root / name).read_text()
            except FileNotFoundError:
                return None
        target = self._remote_path(name)
        if not self._call("HEAD", name, lambda: self.fs.exists(target)):
            return None
        return bytes(self._call("GET", name, lambda: self.fs.cat_file(target))).decode()

    def stat(self, name: str) -> tuple[int, str | None] | None:
        """``(size, version)`` of ``name``, or None where it is missing."""
        if not self.remote:
            try:
                st = (self.root / name).stat()
            except FileNotFoundError:
                return None
            return st.st_size, str(st.st_mtime_ns)
        from tidal.errors import SourceError
        from tidal.storage.fs import Remote

        url = self.where(name)
        proto = url.split("://", 1)[0]
        try:
            found = Remote(proto, Storage(options=self.options)).stat(url)
        except SourceError:
            return None
        return found.size, found.version

    def names(self, under: str = "") -> list[str]:
        """Names of the files directly in the destination (or in ``under``); empty when it does not exist."""
        if not self.remote:
            where = self.root / under
            return sorted(p.name for p in where.iterdir()) if where.is_dir() else []
        target = self._remote_path(under) if under else self._remote_path("")
        try:
            found = self._call("LIST", under or ".", lambda: self.fs.ls(target, detail=False))
        except OSError:
            return []
        return sorted(posixpath.basename(str(p).rstrip("/")) for p in found)

    def remove(self, name: str) -> None:
        if not self.remote:
            (self.root / name).unlink(missing_ok=True)
        elif self.stat(name) is not None:
            target = self._remote_path(name)
            self._call("DELETE", name, lambda: self.fs.rm_file(target))
