"""The clients tidal builds for a URL's filesystem, each with its own retries off and tidal's timeouts.

Every request goes through :func:`tidal.storage.retry.call` (see :mod:`tidal.storage.fs`), so
where tidal builds the client, the client's own retry loop is turned off and retries are counted
once, in one place: s3fs and obstore (:func:`s3fs_client`, :func:`obstore_client`), gcsfs
(:func:`gcsfs_client`), adlfs (:func:`adlfs_client`) and the Hub's ``HfFileSystem``
(:func:`hub_client`); fsspec's HTTP filesystem has none (:func:`aiohttp_timeout` gives its
timeouts). docs/remote.md tabulates what each one did and what a try is. Each client class is
made on first use, so importing this module imports no cloud library.

obstore's runtime does not survive ``fork``, which is how torch starts DataLoader workers: a
process forked from one in which tidal started it must not use obstore (:func:`obstore_safe`).
:func:`obstore_options` says whether s3fs-style ``storage_options`` have an obstore equivalent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from tidal.errors import StorageError
from tidal.storage.config import Storage


def s3fs_client(options: dict, storage: Storage) -> Any:
    """s3fs with botocore's and s3fs's own retries off and tidal's timeouts."""
    config = dict(options.pop("config_kwargs", None) or {})
    config.setdefault("connect_timeout", min(storage.timeout, 10.0))
    config.setdefault("read_timeout", storage.timeout)
    config.setdefault("retries", {"total_max_attempts": 1})
    return _TidalS3(config_kwargs=config, **options)


def _s3_class() -> type:
    from s3fs import S3FileSystem

    class TidalS3FileSystem(S3FileSystem):
        """s3fs whose own retry loop tries once: tidal retries, and counts."""

        retries = 1

    return TidalS3FileSystem


def aiohttp_timeout(storage: Storage) -> Any:
    """aiohttp's timeouts of one request: connect within ``min(timeout, 10)`` s, no read pause over ``timeout``."""
    import aiohttp

    t = storage.timeout
    return aiohttp.ClientTimeout(sock_connect=min(t, 10.0), sock_read=t)


def gcsfs_client(options: dict, storage: Storage) -> Any:
    """gcsfs with its own retry loops off and tidal's timeouts.

    gcsfs retries each HTTP request up to 6 times (waits of 1, 2, 4, ... s) and, in the class
    it exports by default (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` unset or true), asks a gRPC
    API for each bucket's layout with 60 s of retries; inside tidal's 8 tries that took a
    refused connection minutes to report."""
    options.setdefault("requests_timeout", aiohttp_timeout(storage))
    cls = _TidalGCS.cls()
    if getattr(cls, "layout_lookup", False):
        options.setdefault("retry_timeout", 0.0)  # its storage-layout RPC: one try, however it fails
    return _TidalGCS(**options)


def _gcs_class() -> type:
    import gcsfs

    base: Any = gcsfs.GCSFileSystem  # ExtendedGcsFileSystem unless GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
    once: Any = getattr(base._request, "__wrapped__", None)  # the request without gcsfs's retry_request decorator
    if once is None:  # pragma: no cover - a gcsfs that no longer decorates it
        raise StorageError("this version of gcsfs has no undecorated _request: tidal cannot turn its retries off")

    class TidalGCSFileSystem(base):
        """gcsfs whose requests are tried once: tidal retries, and counts."""

        retries = 1
        layout_lookup = hasattr(base, "_get_bucket_type")

        async def _request(self, *args: Any, **kwargs: Any) -> Any:
            return await once(self, *args, **kwargs)

    return TidalGCSFileSystem


def adlfs_client(options: dict, storage: Storage) -> Any:
    """adlfs whose Azure SDK client tries each request once (its default: 3 more tries after
    waits of 15 s and more) with tidal's connect and read timeouts."""
    t = storage.timeout
    client = {"retry_total": 0, "connection_timeout": min(t, 10.0), "read_timeout": t}
    return _TidalAzure(tidal_client_kwargs=client, **options)


def _azure_class() -> type:
    from adlfs import AzureBlobFileSystem
    from azure.storage.blob.aio import BlobServiceClient

    class TidalAzureBlobFileSystem(AzureBlobFileSystem):
        """adlfs whose service client is made again, as adlfs made it, with the Azure SDK's
        retries off and tidal's timeouts (adlfs passes no client options through)."""

        def __init__(self, *args: Any, tidal_client_kwargs: dict[str, Any], **kwargs: Any) -> None:
            self._tidal_client_kwargs = tidal_client_kwargs
            super().__init__(*args, **kwargs)

        def do_connect(self) -> None:
            super().do_connect()
            made: Any = self.service_client  # type: ignore[has-type]  # adlfs is untyped
            self.service_client = BlobServiceClient(
                made.primary_endpoint,  # with a SAS token's query string, where adlfs put one there
                credential=made.credential,  # the credential policy adlfs's client derived
                secondary_hostname=made.secondary_hostname,
                _location_mode=made._location_mode,
                **self._tidal_client_kwargs,
            )

    return TidalAzureBlobFileSystem


def hub_client(options: dict, storage: Storage) -> Any:
    """The Hub's ``HfFileSystem`` whose reads of file data are one GET each, under tidal's timeout."""
    return _TidalHub(tidal_timeout=storage.timeout, **options)


def _hub_class() -> type:
    from huggingface_hub import HfFileSystem
    from huggingface_hub.utils import hf_raise_for_status, http_backoff

    class TidalHfFileSystem(HfFileSystem):
        """HfFileSystem whose reads of file data are one GET each, under tidal's timeout.

        Its own reads retry: a ranged read 5 more times (``http_backoff``: waits of 1 to 8 s), a
        whole file streamed with retries of its own. Its metadata requests (listing, paths-info)
        are tried once already."""

        def __init__(self, *args: Any, tidal_timeout: float, **kwargs: Any) -> None:
            self._tidal_timeout = tidal_timeout
            super().__init__(*args, **kwargs)

        def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
            if (start is not None and start < 0) or (end is not None and end < 0):  # from the end: its own way
                return super().cat_file(path, start=start, end=end, **kwargs)
            headers = self._api._build_hf_headers()  # the token, as HfFileSystemFile sends it
            if start or end is not None:
                if end is not None and end <= (start or 0):
                    return b""
                headers["range"] = f"bytes={start or 0}-{'' if end is None else end - 1}"
            response = http_backoff("GET", self.url(path), headers=headers, timeout=self._tidal_timeout, max_retries=0)
            hf_raise_for_status(response)
            return bytes(response.content)

    return TidalHfFileSystem


class _LazyClass:
    """Builds a filesystem subclass on first use, so importing this module imports no cloud library."""

    def __init__(self, make: Callable[[], type]) -> None:
        self._make = make
        self._cls: type | None = None

    def cls(self) -> type:
        if self._cls is None:
            self._cls = self._make()
        return self._cls

    def __call__(self, **kwargs: Any) -> Any:
        return self.cls()(**kwargs)


_TidalS3 = _LazyClass(_s3_class)
_TidalGCS = _LazyClass(_gcs_class)
_TidalAzure = _LazyClass(_azure_class)
_TidalHub = _LazyClass(_hub_class)


# s3fs storage_options that have an exact obstore equivalent
_OBSTORE_KEYS = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token"}


_obstore_pid: int | None = None  # the process in which tidal started obstore's runtime


def obstore_safe() -> bool:
    """Whether obstore can run in this process: its runtime was not started in a process we were forked from.

    A runtime started by tidal is known by its pid; one started by other code is not, so
    obstore imported by anyone else counts as started."""
    if _obstore_pid is not None:
        return _obstore_pid == os.getpid()
    return "obstore" not in sys.modules


def obstore_options(options: dict, strict: bool = False) -> dict | None:
    """obstore's S3 configuration for s3fs-style ``storage_options``; None when one has no equivalent.

    ``strict``: also None unless they name the credentials (or ``anon``) and a region or an
    endpoint, which s3fs (botocore) would otherwise find in profiles, SSO or redirects."""
    if strict:
        creds = options.get("anon") or ("key" in options and "secret" in options)
        where = "endpoint_url" in options or set(options.get("client_kwargs") or {}) & {"region_name", "endpoint_url"}
        if not creds or not where:
            return None
    out: dict[str, Any] = {}
    for k, v in options.items():
        if k in _OBSTORE_KEYS:
            out[_OBSTORE_KEYS[k]] = v
        elif k == "endpoint_url":
            out["endpoint"] = v
        elif k == "anon":
            out["skip_signature"] = bool(v)
        elif k == "client_kwargs" and set(v) <= {"region_name", "endpoint_url"}:
            if "region_name" in v:
                out["region"] = v["region_name"]
            if "endpoint_url" in v:
                out["endpoint"] = v["endpoint_url"]
        else:
            return None
    return out


def _obstore_config(options: dict, storage: Storage) -> tuple[dict, dict]:
    """obstore's S3 configuration and client options: tidal's timeouts, obstore's own retries off."""
    global _obstore_pid
    _obstore_pid = os.getpid()  # its runtime starts here: forks of this process must not use it
    config = obstore_options(options)
    if config is None:
        raise StorageError(
            f"backend='obstore' cannot take these storage_options: {', '.join(sorted(options))} "
            "(it knows key, secret, token, endpoint_url, anon, client_kwargs.region_name)"
        )
    t = storage.timeout
    client: dict[str, Any] = {"timeout": timedelta(seconds=t), "connect_timeout": timedelta(seconds=min(t, 10.0))}
    if str(config.get("endpoint", "")).startswith("http:"):
        client["allow_http"] = True
    return config, client


def obstore_client(options: dict, storage: Storage) -> Any:
    """obstore's fsspec layer: what tidal lists with when obstore is forced."""
    from obstore.fsspec import FsspecStore

    config, client = _obstore_config(options, storage)
    store: Any = FsspecStore
    return store("s3", client_options=client, retry_config={"max_retries": 0}, **config)
