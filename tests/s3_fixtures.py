"""pytest fixtures of a moto S3 server: ``pytest_plugins = ["s3_fixtures"]`` in a test module."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest
from s3_server import S3Server

_names = itertools.count()


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """One moto S3 server, in its own process, for the whole test session."""
    with S3Server() as server:
        yield server


@pytest.fixture
def bucket(s3: S3Server) -> str:
    """A new, empty bucket on the session's server."""
    return s3.bucket(f"test-{os.getpid()}-{next(_names)}")
