"""The s3 workload's store: moto's S3 server on 127.0.0.1 with every loader's copy uploaded to it, the server's log
of every request it served, and what a child reading from it finds in its environment (fake credentials, the
endpoint), so that no setting of this machine's reaches a measurement."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import log

if TYPE_CHECKING:
    from peers.spec import Spec

TESTS = Path(__file__).resolve().parents[2] / "tests"  # the S3 server helper the tests use, as bench_s3.py does
S3_BUCKET = "bench"
# what the children of the s3 workload find in their environment, and nothing else of AWS's: fake credentials
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def s3_env(spec: Spec, env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child reading from the server: without this machine's AWS settings (its variables, config and
    credential files), with fake credentials, Mosaic's endpoint variable, and every cache directory a loader may
    fall back on inside the run's fresh ``spec.cache``."""
    out = {k: v for k, v in env.items() if not k.startswith("AWS_") and k != "S3_ENDPOINT_URL"}
    nowhere = os.path.join(spec.cache, "no-aws-config")
    out |= S3_ENV | {"AWS_CONFIG_FILE": nowhere, "AWS_SHARED_CREDENTIALS_FILE": nowhere}
    out["S3_ENDPOINT_URL"] = spec.endpoint  # read by Mosaic's S3 downloader alone
    for name, sub in (("TIDAL_CACHE_DIR", "tidal-home"), ("HF_HOME", "hf"), ("XDG_CACHE_HOME", "xdg")):
        out[name] = os.path.join(spec.cache, sub)
    return out


def s3_options(spec: Spec) -> dict[str, Any]:
    """s3fs-style ``storage_options`` that reach the server: its endpoint, and the (fake) credentials the parent put
    in this process's environment."""
    return {
        "key": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
        "endpoint_url": spec.endpoint,
        "client_kwargs": {"region_name": os.environ["AWS_DEFAULT_REGION"]},
    }


@contextlib.contextmanager
def s3_server(root: Path, fmts: Iterable[str]) -> Iterator[dict[str, Any]]:
    """moto's S3 server (the tests' ``S3Server``) on a free port of 127.0.0.1, its request log (werkzeug's, one line
    per request) in a file, and each copy of ``fmts`` uploaded to ``s3://bench/<format>/``: every file of it but
    dot-files (tidal's index of the local copy stays behind, so tidal indexes the objects as any store has them).
    Yields the endpoint, the URL of each format, the log's path and what was uploaded."""
    sys.path.insert(0, str(TESTS))
    from s3_server import S3Server

    with tempfile.TemporaryDirectory(prefix="tidal-bench-s3-") as tmp:
        log_path = Path(tmp) / "moto.log"

        class LoggedS3Server(S3Server):
            def _spawn(self, args: list[str]) -> None:  # the server's stderr (its request log) to a file
                with open(log_path, "ab") as f:
                    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
                    self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=f, env=env)

        with LoggedS3Server() as s3:
            client = s3.client
            client.create_bucket(Bucket=S3_BUCKET)
            t0 = time.perf_counter()
            urls, uploaded = {}, {}
            for fmt in sorted(set(fmts)):
                local = root / fmt
                files = [p for p in sorted(local.rglob("*")) if p.is_file() and not p.name.startswith(".")]
                for path in files:
                    with open(path, "rb") as body:  # streamed from the file: S3Server.put would keep every byte
                        client.put_object(
                            Bucket=S3_BUCKET, Key=f"{fmt}/{path.relative_to(local).as_posix()}", Body=body
                        )
                urls[fmt] = f"s3://{S3_BUCKET}/{fmt}"
                uploaded[fmt] = {"objects": len(files), "bytes": sum(p.stat().st_size for p in files)}
            upload_s = time.perf_counter() - t0
            mb = sum(u["bytes"] for u in uploaded.values()) / 1e6
            log(f"moto S3 server at {s3.endpoint}: {mb:,.0f} MB uploaded in {upload_s:.1f} s")
            yield {
                "endpoint": s3.endpoint,
                "urls": urls,
                "log": str(log_path),
                "uploaded": uploaded,
                "upload_s": upload_s,
            }


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d{3})')


def server_requests(log_path: str, start: int) -> dict[str, int]:
    """The requests the server logged from byte ``start`` of its log on (the measurements run one at a time, so
    these are one run's): GETs, all requests, and those answered with an error status."""
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    methods: Counter[str] = Counter()
    errors = 0
    for line in _ANSI.sub("", text).splitlines():
        m = _REQUEST.search(line)
        if m and not m.group(2).startswith("/moto-api"):
            methods[m.group(1)] += 1
            errors += int(m.group(3)) >= 400
    return {"server_gets": methods["GET"], "server_requests": methods.total(), "server_errors": errors}
