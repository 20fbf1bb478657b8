"""A real GCS endpoint for tests: ``gcp-storage-emulator``, in its own process, on 127.0.0.1.

The emulator speaks GCS's JSON API on a free port; gcsfs reaches it through its real stack
(aiohttp) with ``endpoint_url`` and ``token="anon"``. Test data is put in over plain HTTP
(``urllib``), not through the client under test. Nothing leaves the machine.

gcsfs exports, unless ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` is false when it is imported, a
class that first asks a gRPC API of Google's for each bucket's layout, which an emulator does
not serve (docs/remote.md): this module sets it to false before anything imports gcsfs, as a
user of an emulator or a GCS-compatible store does.

>>> with GCSServer() as gcs:
...     url = gcs.upload(local_dir, "bucket", "web")         # gs://bucket/web
...     tidal.Dataset(url, storage_options=gcs.options())
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from procs import free_port

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
PROJECT = "test-project"


def emulator_command() -> list[str]:
    """The emulator's program, installed beside this Python by the dev extra (``make``)."""
    exe = shutil.which("gcp-storage-emulator", path=os.path.dirname(sys.executable)) or shutil.which(
        "gcp-storage-emulator"
    )
    if exe is None:
        raise RuntimeError(
            "gcp-storage-emulator is not installed: `make .venv/.tidal-installed` installs the dev extra, which has it"
        )
    return [exe]


class GCSServer:
    """``gcp-storage-emulator`` on ``127.0.0.1:<free port>``, in memory; ``stop()`` (or leaving ``with``) ends it."""

    scheme = "gs"

    def __init__(self, start_timeout: float = 60.0):
        self.proc: subprocess.Popen | None = None
        for _ in range(5):  # another process may take the free port first: try another
            self.port = free_port()
            self.endpoint = f"http://127.0.0.1:{self.port}"
            self.proc = subprocess.Popen(
                [*emulator_command(), "start", "-H", "127.0.0.1", "--port", str(self.port), "--in-memory", "-q"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait(start_timeout):
                break
            self.stop()
        else:
            raise RuntimeError("gcp-storage-emulator did not start")

    def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b?project={PROJECT}", timeout=1):
                    return True
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        return False

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        """gcsfs ``storage_options`` that reach this server (or a proxy in front of it)."""
        return {"endpoint_url": endpoint or self.endpoint, "token": "anon", "project": PROJECT}

    def _call(self, method: str, path: str, body: bytes, content_type: str) -> None:
        request = urllib.request.Request(
            self.endpoint + path, data=body, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def bucket(self, name: str) -> str:
        self._call("POST", f"/storage/v1/b?project={PROJECT}", json.dumps({"name": name}).encode(), "application/json")
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        name = urllib.parse.quote(key, safe="")
        self._call(
            "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}", data, "application/octet-stream"
        )

    def upload(self, local: Path, bucket: str, prefix: str) -> str:
        """Every file under ``local`` to ``gs://bucket/prefix/...``; the URL of the prefix."""
        for path in sorted(local.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                self.put(bucket, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
        return f"gs://{bucket}/{prefix}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> GCSServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
