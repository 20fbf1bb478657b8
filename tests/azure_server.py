"""A real Azure Blob endpoint for tests: Azurite, in its own process, on 127.0.0.1.

Azurite is Microsoft's emulator, a Node.js program from the npm registry: ``make`` installs
the version pinned in ``requirements/azurite/`` into ``.venv/azurite`` wherever ``npm`` is on
the machine. adlfs reaches it through its real stack (azure-storage-blob over aiohttp) with a
connection string; test data is put in with the Azure SDK's own client. The account is
Azurite's well-known development account, no real credential. Nothing leaves the machine.

>>> with AzureServer() as az:
...     url = az.upload(local_dir, "container", "web")       # az://container/web
...     tidal.Dataset(url, storage_options=az.options())
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from procs import free_port

ACCOUNT = "devstoreaccount1"
# Azurite's published development key: the same in every Azurite, documented with it
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE = Path(__file__).resolve().parents[1] / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"


class AzuriteMissing(RuntimeError):
    """Azurite is not installed; ``npm_missing`` says whether it cannot be, here."""

    def __init__(self, npm_missing: bool):
        self.npm_missing = npm_missing
        if npm_missing:
            super().__init__("npm is not installed on this machine, so neither is Azurite (the Azure emulator)")
        else:
            super().__init__(
                f"Azurite is not installed at {AZURITE}: `make .venv/.tidal-installed` installs it with npm "
                "(the version pinned in requirements/azurite/)"
            )


def connection_string(endpoint: str) -> str:
    return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={endpoint}/{ACCOUNT};"


class AzureServer:
    """Azurite's blob service on ``127.0.0.1:<free port>``, in memory; ``stop()`` (or leaving ``with``) ends it."""

    scheme = "az"

    def __init__(self, workdir: Path, start_timeout: float = 90.0):
        if not AZURITE.exists():
            raise AzuriteMissing(shutil.which("npm") is None)
        self.proc: subprocess.Popen | None = None
        self._client: Any = None
        for _ in range(5):  # another process may take the free port first: try another
            self.port = free_port()
            self.endpoint = f"http://127.0.0.1:{self.port}"
            args = ["--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--inMemoryPersistence", "--silent"]
            args += ["--skipApiVersionCheck", "--disableTelemetry", "--loose"]  # in memory: no --location
            self.proc = subprocess.Popen(
                [str(AZURITE), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir
            )
            if self._wait(start_timeout):
                break
            self.stop()
        else:
            raise RuntimeError("Azurite did not start")

    def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        """adlfs ``storage_options`` that reach this server (or a proxy in front of it)."""
        return {"connection_string": connection_string(endpoint or self.endpoint)}

    @property
    def client(self) -> Any:
        """The Azure SDK's own client of the server: for putting test data, never through a proxy."""
        if self._client is None:
            from azure.storage.blob import BlobServiceClient

            self._client = BlobServiceClient.from_connection_string(connection_string(self.endpoint))
        return self._client

    def bucket(self, name: str) -> str:
        """A new container (a bucket, as the other stores call it)."""
        self.client.create_container(name)
        return name

    def put(self, container: str, key: str, data: bytes) -> None:
        self.client.get_blob_client(container, key).upload_blob(data, overwrite=True)

    def upload(self, local: Path, container: str, prefix: str) -> str:
        """Every file under ``local`` to ``az://container/prefix/...``; the URL of the prefix."""
        for path in sorted(local.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                self.put(container, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
        return f"az://{container}/{prefix}"

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> AzureServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
