"""Bad data, one way for every format: the ``errors=`` policy applied, and which exceptions mean bad bytes.

A reader builds the :class:`~tidal.errors.RecordError` (or :class:`~tidal.errors.FormatError`)
naming the file and the row and hands it to :func:`bad`; :func:`data_errors` lists the
exceptions of Python and the dependencies that bad bytes cause; :func:`exhausted` tells the
machine's fault (file descriptors, memory, disk) from the data's, which is never skipped.
Apart from the registry because every reader and the source stage need it, and none of the
registry.
"""

from __future__ import annotations

import errno
import functools
import re
from typing import Any

from tidal.errors import ArgumentError, TidalError
from tidal.formats import Errors


def check_errors(errors: Any) -> Errors:
    """``errors`` if it is a policy: ``"raise"``, ``"skip"`` or a callable."""
    if errors in ("raise", "skip") or callable(errors):
        return errors
    raise ArgumentError(f"errors must be 'raise', 'skip' or a function, not {errors!r}")


def bad(errors: Errors, error: TidalError) -> None:
    """Apply the policy to one bad record or part of a file: raise ``error``, or return so
    the caller skips what it names."""
    if errors == "skip":
        return
    if errors == "raise" or not callable(errors):
        raise error
    errors(error)


@functools.cache
def _data_errors() -> tuple[type[Exception], ...]:
    import decimal
    import pickle
    import struct
    import tarfile
    import tokenize
    import zlib

    import pyarrow as pa
    import zstandard

    return (
        OSError,
        EOFError,
        ValueError,  # also UnicodeDecodeError, orjson's JSONDecodeError, pyarrow's ArrowInvalid
        LookupError,  # KeyError, IndexError: a header or config that does not hold what it must
        TypeError,
        OverflowError,
        zlib.error,
        struct.error,
        tarfile.TarError,
        pickle.UnpicklingError,
        decimal.InvalidOperation,
        pa.ArrowException,
        zstandard.ZstdError,
        SyntaxError,  # numpy parses a .npy header with ast (and tokenize, for old headers)
        tokenize.TokenError,
    )


def data_errors() -> tuple[type[Exception], ...]:
    """The exceptions of Python and the dependencies that bad bytes cause (import is lazy)."""
    return _data_errors()


_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC, errno.EDQUOT}
_EXHAUSTED_TEXT = re.compile(r"[Ee]rrno ({})\b".format("|".join(str(n) for n in sorted(_EXHAUSTED))))


def exhausted(exc: BaseException) -> str | None:
    """What the machine ran out of, where ``exc`` (or what caused it) says it did: file
    descriptors, memory or disk. Such an error is never the data's fault, so it is never
    skipped as bad data nor remembered in the index (a reader or a library may have wrapped
    it, keeping only ``[Errno 24]`` in its message)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, MemoryError):
            return "memory"
        number = e.errno if isinstance(e, OSError) else None
        if number is None:
            found = _EXHAUSTED_TEXT.search(str(e))
            number = int(found.group(1)) if found else None
        if number in _EXHAUSTED:
            return {errno.EMFILE: "file descriptors (ulimit -n)", errno.ENFILE: "file descriptors"}.get(
                number, "memory" if number == errno.ENOMEM else "disk space"
            )
        e = e.__cause__ or e.__context__
    return None
