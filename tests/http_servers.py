"""Python's own HTTP file server on 127.0.0.1, for the tests of http:// datasets."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class Logged(Quiet):
    """Python's own file server (``Range`` ignored: a 200 with the whole file), each request logged."""

    def send_head(self) -> Any:
        self.server.seen.append((self.command, self.path, self.headers.get("Range")))  # type: ignore[attr-defined]
        return super().send_head()


@contextlib.contextmanager
def serving(root: Path, handler: type = Logged) -> Iterator[tuple[str, list]]:
    """``root`` behind ``http://127.0.0.1:<free port>``, and the list of requests it answers."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.seen  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
