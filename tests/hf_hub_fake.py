"""A small local fake of the Hugging Face Hub's HTTP API, enough for ``huggingface_hub.HfFileSystem``.

It serves dataset repos from local directories, one per revision (``main``,
``refs/convert/parquet``, ...), on ``127.0.0.1:<free port>``: the endpoints HfFileSystem
calls to read a repo, and nothing else.

- ``GET  /api/datasets/{repo}/revision/{rev}``: the repo exists at this revision
- ``GET  /api/datasets/{repo}/tree/{rev}[/{path}]?recursive=&expand=``: a directory listing
- ``POST /api/datasets/{repo}/paths-info/{rev}`` (form ``paths``): facts about some paths
- ``GET|HEAD /datasets/{repo}/resolve/{rev}/{path}``: a file's bytes, ``Range`` honoured

>>> with FakeHub({"org/web": {"main": tmp / "main"}}) as hub:
...     tidal.Dataset("hf://datasets/org/web", storage_options=hub.options())
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class FakeHub:
    """``repos``: ``{"org/name": {revision: directory}}``; ``requests`` logs ``(method, path)``."""

    def __init__(self, repos: dict[str, dict[str, Path]]):
        self.repos = {r: {rev: Path(d) for rev, d in revs.items()} for r, revs in repos.items()}
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def options(self) -> dict[str, Any]:
        """``storage_options`` for tidal: HfFileSystem pointed at this server, no token."""
        return {"endpoint": self.endpoint, "token": False}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the repos ---------------------------------------------------------------------------

    def revision(self, repo: str, rev: str) -> tuple[str, Path] | None:
        """The revision (a name or its commit sha) and its directory."""
        for name, root in self.repos.get(repo, {}).items():
            if rev in (name, _sha(f"{repo}@{name}")):
                return name, root
        return None

    def split_revision(self, repo: str, rest: str) -> tuple[str, Path, str] | None:
        """``rest`` is ``{rev}/{path}`` with the revision quoted or not: (name, root, path)."""
        for name, root in self.repos.get(repo, {}).items():
            for form in (quote(name, safe=""), name, _sha(f"{repo}@{name}")):
                if rest == form or rest.startswith(form + "/"):
                    return name, root, unquote(rest[len(form) + 1 :])
        return None


def _entry(root: Path, path: Path, expand: bool) -> dict:
    rel = path.relative_to(root).as_posix()
    if path.is_dir():
        return {"type": "directory", "oid": _sha(rel), "path": rel}
    data = path.read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    entry: dict[str, Any] = {"type": "file", "oid": blob, "size": len(data), "path": rel}
    if expand:
        entry["lastCommit"] = {"id": _sha(rel), "title": "add", "date": "2024-01-01T00:00:00.000Z"}
    return entry


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, value: Any) -> None:
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _missing(self, code: str, head: bool = False) -> None:
        self._send(404, json.dumps({"error": code}).encode(), {"X-Error-Code": code, "X-Error-Message": code}, head)

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        self.fake.requests.append((method, url.path))
        parts = url.path.strip("/").split("/")
        query = parse_qs(url.query)
        if parts[:2] == ["api", "datasets"] and len(parts) == 4:  # the repo at its default revision
            found_main = self.fake.revision("/".join(parts[2:4]), "main")
            if found_main is None:
                return self._missing("RepoNotFound")
            return self._json(
                {"id": "/".join(parts[2:4]), "sha": _sha(f"{'/'.join(parts[2:4])}@main"), "private": False}
            )
        if parts[:2] == ["api", "datasets"] and len(parts) >= 6:
            repo, action, rest = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
            rev_raw, _, path_raw = rest.partition("/")
            found = self.fake.revision(repo, unquote(rev_raw))
            if repo not in self.fake.repos:
                return self._missing("RepoNotFound")
            if found is None:
                return self._missing("RevisionNotFound")
            name, root = found
            if action == "revision":
                return self._json({"id": repo, "sha": _sha(f"{repo}@{name}"), "private": False, "siblings": []})
            if action == "tree":
                return self._tree(root, unquote(path_raw), query)
            if action == "paths-info" and method == "POST":
                return self._paths_info(root)
        if parts[:1] == ["datasets"] and len(parts) >= 5 and parts[3] == "resolve":
            repo = "/".join(parts[1:3])
            found_file = self.fake.split_revision(repo, "/".join(parts[4:]))
            if found_file is None:
                return self._missing("RevisionNotFound", method == "HEAD")
            name, root, rel = found_file
            return self._file(root / rel, repo, name, method == "HEAD")
        self._send(404, b"not found")

    def _tree(self, root: Path, rel: str, query: dict) -> None:
        where = root / rel if rel else root
        if not where.is_dir():
            return self._missing("EntryNotFound")
        recursive = query.get("recursive", ["False"])[0].lower() == "true"
        expand = query.get("expand", ["False"])[0].lower() == "true"
        found = sorted(where.rglob("*") if recursive else where.iterdir())
        self._json([_entry(root, p, expand) for p in found])

    def _paths_info(self, root: Path) -> None:
        length = int(self.headers.get("Content-Length", 0))
        form = parse_qs(self.rfile.read(length).decode())
        expand = form.get("expand", ["False"])[0].lower() == "true"
        out = [_entry(root, root / p, expand) for p in form.get("paths", []) if (root / p).exists()]
        self._json(out)

    def _file(self, path: Path, repo: str, rev: str, head: bool) -> None:
        if not path.is_file():
            return self._missing("EntryNotFound", head)
        data = path.read_bytes()
        headers = {
            "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
            "Accept-Ranges": "bytes",
            "X-Repo-Commit": _sha(f"{repo}@{rev}"),
            "Content-Type": "application/octet-stream",
        }
        spec = self.headers.get("Range")
        if spec and spec.startswith("bytes="):
            a, _, b = spec[len("bytes=") :].partition("-")
            start = int(a) if a else max(0, len(data) - int(b))
            stop = min(len(data), int(b) + 1) if a and b else len(data)
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
            return self._send(206, data[start:stop], headers, head)
        self._send(200, data, headers, head)

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_POST(self) -> None:
        self._route("POST")
