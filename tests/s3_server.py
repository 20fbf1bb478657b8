"""A real S3 endpoint for tests and benchmarks: moto's server, in its own process, on 127.0.0.1.

The server is the ``moto_server`` program on a free port; clients reach it through their
real stack (botocore/aiohttp for s3fs, reqwest for obstore) with ``endpoint_url``. Nothing
leaves the machine, and no credentials are real.

>>> with S3Server() as s3:
...     s3.put("bucket", "web/a.jsonl", b'{"text": "hi"}\\n')
...     tidal.Dataset("s3://bucket/web", storage_options=s3.options())
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from procs import free_port

KEY, SECRET, REGION = "testing-key", "testing-secret", "us-east-1"


class S3Server:
    """moto's S3 server on ``127.0.0.1:<free port>``; ``stop()`` (or leaving ``with``) ends it."""

    def __init__(self, start_timeout: float = 30.0):
        self.proc: subprocess.Popen | None = None
        for _ in range(5):  # another process may take the free port first: try another
            self.port = free_port()
            self.endpoint = f"http://127.0.0.1:{self.port}"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            if self._wait(start_timeout):
                break
            self._end()
        else:
            raise RuntimeError("moto's S3 server did not start")
        self._client: Any = None

    def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1):
                    return True
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        return False

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        """s3fs-style ``storage_options`` that reach this server (or a proxy in front of it)."""
        return {
            "key": KEY,
            "secret": SECRET,
            "endpoint_url": endpoint or self.endpoint,
            "client_kwargs": {"region_name": REGION},
        }

    @property
    def client(self) -> Any:
        """A boto3 client of the server itself: for putting test data, never through a proxy."""
        if self._client is None:
            import boto3

            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint,
                aws_access_key_id=KEY,
                aws_secret_access_key=SECRET,
                region_name=REGION,
            )
        return self._client

    def bucket(self, name: str) -> str:
        self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def upload(self, local: Path, bucket: str, prefix: str) -> str:
        """Every file under ``local`` to ``s3://bucket/prefix/...``; the URL of the prefix."""
        for path in sorted(local.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                self.put(bucket, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
        return f"s3://{bucket}/{prefix}"

    def _end(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def stop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        self._end()

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
