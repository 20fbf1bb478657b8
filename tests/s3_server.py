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


# moto's server, its buckets and objects put in before it listens (moto keeps them in memory
# only): what a restarted server looks like to its clients, the same data on the same port
_PRELOADED = """
import pathlib, signal, sys
import boto3
from moto import mock_aws
from moto.server import ThreadedMotoServer

port, root = int(sys.argv[1]), pathlib.Path(sys.argv[2])
with mock_aws():
    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    for bucket in sorted(root.iterdir()):
        s3.create_bucket(Bucket=bucket.name)
        for path in sorted(p for p in bucket.rglob("*") if p.is_file()):
            s3.put_object(Bucket=bucket.name, Key=path.relative_to(bucket).as_posix(), Body=path.read_bytes())
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.stop()
"""


class S3Server:
    """moto's S3 server on ``127.0.0.1:<free port>``; ``stop()`` (or leaving ``with``) ends it.

    ``restart()`` (or ``halt()``, then ``resume()``) stops it and starts it again on the same
    port with the same buckets and objects, as a real store comes back after an outage."""

    def __init__(self, start_timeout: float = 30.0):
        self.proc: subprocess.Popen | None = None
        self._objects: dict[str, dict[str, bytes]] = {}  # what was put, for restart()
        for _ in range(5):  # another process may take the free port first: try another
            self.port = free_port()
            self.endpoint = f"http://127.0.0.1:{self.port}"
            self._spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)])
            if self._wait(start_timeout):
                break
            self._end()
        else:
            raise RuntimeError("moto's S3 server did not start")
        self._client: Any = None

    def _spawn(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )

    def restart(self, preload: Path, down_s: float = 0.0) -> None:
        """Stop the server, wait ``down_s``, start it again on the same port with the same data.

        ``preload``: an empty directory to stage the data in for the new server."""
        self.halt()
        time.sleep(down_s)
        self.resume(preload)

    def halt(self) -> None:
        """Stop the server, as an outage does: its clients' connections are refused until :meth:`resume`."""
        self._end()

    def resume(self, preload: Path, start_timeout: float = 60.0) -> None:
        """Start the server again on its port, the objects put before :meth:`halt` in it before it listens."""
        for bucket, objects in self._objects.items():
            (preload / bucket).mkdir(parents=True, exist_ok=True)
            for key, data in objects.items():
                path = preload / bucket / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        self._spawn([sys.executable, "-c", _PRELOADED, str(self.port), str(preload)])
        if not self._wait(start_timeout):
            self._end()
            raise RuntimeError(f"moto's S3 server did not start again on port {self.port}")

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
        self._objects.setdefault(name, {})
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)
        self._objects.setdefault(bucket, {})[key] = data

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
