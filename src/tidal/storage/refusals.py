"""What a store's refusal means, in words a user acts on.

Clients report a refusal in their own terms: s3fs turns S3's ``403`` into ``PermissionError:
Forbidden``, botocore says ``NoCredentialsError: Unable to locate credentials``, adlfs and gcsfs
say ``FileNotFoundError`` of a path whether the object or its bucket is missing. A user needs to
know which of these it is: no credentials were found, the store does not accept the ones in use,
they are not allowed this request on this bucket, or the bucket does not exist.
:func:`refused` says the first three (:func:`explain` puts it in the
:class:`~tidal.errors.StorageError` of every request :mod:`tidal.storage.fs` and a conversion's
output make), :func:`bucket_gone` recognises the last where the client says so. Nor is every "not found" an
absence: :func:`not_found` tells the store's "no such object" from a failure to ask it, and
:func:`already_exists` a conditional write refused because the object is there. Nothing here is
imported from a client library: errors are read by type name, status and code, as
:mod:`tidal.storage.retry` reads them.
"""

from __future__ import annotations

import re

from tidal.errors import StorageError
from tidal.storage.retry import code_and_status, redact, transient

_BUCKETED = {"s3": "bucket", "s3a": "bucket", "gs": "bucket", "gcs": "bucket"}
_BUCKETED.update(az="container", abfs="container", abfss="container")
# the store knows the caller, and does not allow the request
_DENIED_CODES = {
    "AccessDenied",
    "AllAccessDisabled",
    "AuthorizationPermissionMismatch",
    "AuthorizationPermissionDenied",
    "InsufficientAccountPermissions",
    "AccountIsDisabled",
    "Forbidden",
}
# the store does not accept the credentials themselves
_REJECTED_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AuthenticationFailed",
    "AuthorizationFailure",
    "InvalidAuthenticationInfo",
    "NoAuthenticationInformation",
    "InvalidClientTokenId",
}
_CODE_TEXT = re.compile(r"\((\w+)\) when calling|ErrorCode:\s*(\w+)|<Code>(\w+)</Code>")
# gcsfs gives a 403 as ``OSError: Forbidden: <url>\n<who> does not have storage.objects.get access ...``, no status
_DENIED_TEXT = re.compile(r"\bdoes not have [\w.]+ access\b|\bPermission '[\w.]+' denied\b|(?:Error|^): Forbidden\b")
_NO_CREDENTIALS = re.compile(r"NoCredentialsError|Unable to locate credentials|[Aa]nonymous caller")
_GONE_CODES = {"NoSuchBucket", "ContainerNotFound", "ContainerBeingDeleted"}
_GONE_TEXT = re.compile(
    r"NoSuchBucket|ContainerNotFound|specified (?:bucket|container) does not exist|No such container"
)
_VERBS = {"LIST": "list", "HEAD": "read", "GET": "read", "PUT": "write", "DELETE": "delete"}
_WHERE = {
    "s3": "storage_options (key, secret, token), the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
    "AWS_PROFILE) or ~/.aws; for public data, storage_options={'anon': True}",
    "gs": "storage_options (token: a service account file, or 'google_default'), GOOGLE_APPLICATION_CREDENTIALS "
    "or `gcloud auth application-default login`; for public data, storage_options={'token': 'anon'}",
    "az": "storage_options (account_name with account_key, sas_token or connection_string, or "
    "anon=False for Azure AD) or the AZURE_STORAGE_* environment variables",
}
_WHERE.update(s3a=_WHERE["s3"], gcs=_WHERE["gs"], abfs=_WHERE["az"], abfss=_WHERE["az"])
_WHERE_ANY = "storage_options, the environment or the client's own configuration"


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and len(out) < 8 and not any(e is s for s in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _codes(exc: BaseException) -> tuple[set[str], set[int], str]:
    """The error codes, HTTP statuses and text of every error in the chain of ``exc``."""
    codes: set[str] = set()
    statuses: set[int] = set()
    texts = []
    for e in _chain(exc):
        code, status = code_and_status(e)
        if code:
            codes.add(str(code))
        if status is not None:
            statuses.add(status)
        named = getattr(e, "error_code", None)  # azure-core: a StorageErrorCode, a str enum
        if named:
            codes.add(str(getattr(named, "value", named)))
        text = f"{type(e).__name__}: {e}"
        texts.append(text)
        for found in _CODE_TEXT.findall(text):
            codes.update(c for c in found if c)
    return codes, statuses, " ".join(texts)


def refused(exc: BaseException, url: str, what: str) -> str | None:
    """A message for the request ``what`` of ``url`` that failed with ``exc``, where the store
    refused it (no credentials found, credentials not accepted, access denied); None otherwise.

    >>> refused(PermissionError("Forbidden"), "s3://bkt/data/", "LIST")
    "s3://bkt/data/: LIST failed: access denied (HTTP 403): the credentials in use may not list ..."
    """
    codes, statuses, text = _codes(exc)
    said = str(exc).split(" failed: ", 1)[-1] if " failed: " in str(exc) else text
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    where = _WHERE.get(scheme, _WHERE_ANY)
    head = f"{redact(url)}: {what} failed"
    if _NO_CREDENTIALS.search(text):
        return f"{head}: no credentials were found to sign the request with ({said}); give them in {where}"
    if codes & _REJECTED_CODES or 401 in statuses:
        return (
            f"{head}: the store does not accept the credentials in use (an unknown key, a wrong secret, an expired "
            f"token?): check which credentials tidal is given, in {where} ({said})"
        )
    denied = (
        codes & _DENIED_CODES
        or 403 in statuses
        or any(isinstance(e, PermissionError) for e in _chain(exc))
        or _DENIED_TEXT.search(text)
    )
    if not denied:
        return None
    verb = _VERBS.get(what.split(" ", 1)[0], "read")
    bucket = bucket_of(url)
    scope = f"the {_BUCKETED[scheme]} {bucket.split('://', 1)[1]!r}" if bucket is not None else "it"
    target = "the objects under it" if verb == "list" else "it"
    return (
        f"{head}: access denied (HTTP 403): the credentials in use may not {verb} {target}; check that they are "
        f"the ones meant (storage_options, the environment, the profile) and that they are granted {verb} access "
        f"to {scope} ({said})"
    )


def explain(exc: StorageError, url: str, what: str) -> StorageError:
    """``exc``, a request given up on, as a :class:`StorageError` that says why in words where the
    store refused it (see :func:`refused`); as it is otherwise. Raise what it returns."""
    why = refused(exc, url, what) if exc.permanent else None
    if why is None:
        return exc
    explained = StorageError(why, url=exc.url, attempts=exc.attempts, permanent=True)
    explained.__cause__ = exc.__cause__
    return explained


def bucket_of(url: str) -> str | None:
    """``scheme://bucket`` of an object store URL (``s3``, ``gs``, ``az``...); None elsewhere."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _BUCKETED or not rest.split("/", 1)[0]:
        return None
    return f"{scheme}://{rest.split('/', 1)[0]}"


def bucket_gone(exc: BaseException) -> bool:
    """Whether the store said, in ``exc``, that the bucket (or Azure container) does not exist."""
    codes, _, text = _codes(exc)
    return bool(codes & _GONE_CODES) or bool(_GONE_TEXT.search(text))


def already_exists(exc: BaseException) -> bool:
    """Whether a conditional write failed because the object is there already."""
    e: BaseException | None = exc
    for _ in range(6):
        if e is None:
            return False
        if isinstance(e, FileExistsError) or "PreconditionFailed" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def not_found(exc: BaseException) -> bool:
    """Whether the store said there is no such object (not: could not be reached to ask).

    Some clients raise FileNotFoundError for any failure of a stat (fsspec's HTTP filesystem:
    from a refused connection too); one caused by a transient error is that error."""
    e: BaseException | None = exc
    for _ in range(6):
        if e is None:
            return False
        if not isinstance(e, StorageError):  # tidal's own message names the URL, whose port may be 404xx
            if isinstance(e, FileNotFoundError):
                cause = e.__cause__
                if cause is None:
                    return True
                status = code_and_status(cause)[1]  # a refusal (401, 403) is not an absence
                return not transient(cause) and (status is None or status in (404, 410))
            code, status = code_and_status(e)
            if status == 404 or code in ("NoSuchKey", "404") or "NotFound" in type(e).__name__:
                return True
            if "NoSuchKey" in str(e) or "Not Found" in str(e):
                return True
        e = e.__cause__ or e.__context__
    return False
