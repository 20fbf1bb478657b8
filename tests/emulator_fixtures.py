"""pytest fixtures of the GCS and Azure emulators: ``pytest_plugins = ["emulator_fixtures"]`` in a test module.

Each emulator is one process for the whole test session. A missing emulator fails the test
that needs it, saying how to install it; only where ``npm`` itself is missing (so Azurite
cannot be installed here) are the Azure tests skipped, and the skip says so.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure_server import AzureServer, AzuriteMissing
from gcs_server import GCSServer


@pytest.fixture(scope="session")
def gcs() -> Iterator[GCSServer]:
    """One gcp-storage-emulator for the whole test session."""
    with GCSServer() as server:
        yield server


@pytest.fixture(scope="session")
def azure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureServer]:
    """One Azurite blob service for the whole test session."""
    try:
        server = AzureServer(tmp_path_factory.mktemp("azurite"))
    except AzuriteMissing as exc:
        if exc.npm_missing:
            pytest.skip(str(exc))
        pytest.fail(str(exc))
    with server:
        yield server
