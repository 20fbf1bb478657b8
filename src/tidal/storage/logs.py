"""The DEBUG logs of the client libraries tidal drives, without the credentials tidal was given.

botocore logs every request it sends at DEBUG: its headers (the session token; the access key
id, in ``Authorization``) and the canonical request it signs. Someone who turns DEBUG logging
on to see why a read is slow should be able to paste the log into a bug report. When tidal
builds a client (:mod:`tidal.storage.fs`), :func:`guard` puts one filter on every logger of
the client libraries (a logger's filters see only the records logged on it, not those of its
children, hence each of them). It rewrites a record only when the record holds a secret: a
credential from the ``storage_options`` tidal was given (any string under a key that names
one), a session token or signature header, a signed URL's query string, or the value of any
field that names a secret (:func:`tidal.storage.retry.redact`). Records of loggers
that are not enabled are never made, so this costs nothing unless DEBUG logging is on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from tidal import fork_safe
from tidal.storage.retry import redact

LIBRARIES = (
    "botocore",
    "aiobotocore",
    "boto3",
    "s3transfer",
    "s3fs",
    "fsspec",
    "urllib3",
    "aiohttp",
    "requests",
    "gcsfs",
    "google",
    "adlfs",
    "azure",
    "huggingface_hub",
    "httpx",
    "httpcore",
)
_SECRET_KEY = re.compile(r"(?i)key|secret|token|password|passwd|credential|signature|sas|connection_string")
# what botocore prints of a signed request: the token and key id headers, the signature
_HEADERS = re.compile(
    r"(?i)((?:x-amz-security-token|x-amz-signature|authorization|x-goog-signature|sig)['\"]?\s*[:=]\s*b?['\"]?)"
    r"[^\s,'\"&}]+"
)
_KEY_ID = re.compile(r"(Credential=)[^/\s,'\"]+")


class _Redact(logging.Filter):
    def __init__(self) -> None:
        super().__init__("tidal-redact")
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format is the handler's problem, not ours
            return True
        clean = self.clean(text)
        if clean != text:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:  # a traceback: its errors name URLs too
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            clean = self.clean(record.exc_text)
            if clean != record.exc_text:
                record.exc_info, record.exc_text = None, clean  # formatters print exc_text as it is
        if record.stack_info:
            record.stack_info = self.clean(record.stack_info)
        return True

    def clean(self, text: str) -> str:
        text = _KEY_ID.sub(r"\1<redacted>", _HEADERS.sub(r"\1<redacted>", redact(text)))
        for secret in self.secrets:
            text = text.replace(secret, "<redacted>")
        return text


_filter = _Redact()
_lock = fork_safe.Lock()


def secrets(options: Mapping[str, Any]) -> set[str]:
    """The credentials among ``storage_options``: strings under keys that name one, at any depth."""
    out: set[str] = set()
    for k, v in options.items():
        if isinstance(v, Mapping):
            out |= secrets(v)
        elif isinstance(v, str) and len(v) >= 4 and _SECRET_KEY.search(str(k)):
            out.add(v)
    return out


def guard(options: Mapping[str, Any]) -> None:
    """Keep the credentials in ``options`` out of every client library's log records from now on.

    >>> guard({"key": "AKIA...", "secret": "..."})   # when a client is built from them
    """
    with _lock:
        _filter.secrets |= secrets(options)
        for name in list(logging.Logger.manager.loggerDict):
            if name.split(".", 1)[0] in LIBRARIES:
                logger = logging.getLogger(name)
                if _filter not in logger.filters:
                    logger.addFilter(_filter)
