"""tidal's exceptions, one tree.

    TidalError
    ├── SourceError          a path, glob or URL that names no data (also FileNotFoundError)
    ├── FormatError          no reader for a file, a file that is truncated or corrupt (names it,
    │   │                    and the byte offset or row where known), or a format used wrongly
    │   └── SchemaError      ``columns=`` names a column the data does not have, or shards
    │                        disagree on their columns: never skipped by ``errors="skip"``
    ├── RecordError          one bad record: names the file and its line or row
    ├── StateError           a saved state that does not fit the dataset or loader
    ├── Untraceable          a pipeline whose provenance ``tidal.trace`` cannot give (also
    │                        NotImplementedError): names what it cannot follow
    ├── ArgumentError        an argument a method or class does not accept, raised when it is
    │                        called (also ValueError and TypeError): names it and what it takes
    ├── MissingDependency    an optional package a feature needs is not installed (also
    │                        ImportError): names the ``pip install`` that adds it
    ├── ConfigError          a pipeline config that is malformed (names the key), or a dataset
    │                        that cannot be written as one (a lambda, a tokenizer object...)
    └── StorageError         a remote read that failed for good, a cache that cannot hold a
                             shard, or a machine out of file descriptors, memory or disk
                             (also OSError); names the URL, never credentials; never skipped

Every error that points at data says which file and, where there is one, which line or
row. Context is added with ``add_note`` as an error travels up the stages. No exception of a
dependency (a codec, pyarrow, orjson, tarfile, numpy) leaves tidal raw: each is wrapped in
one of these, naming the file, with the original as ``__cause__`` where it helps debugging.
"""

from __future__ import annotations

from typing import Any


class TidalError(Exception):
    """Base of every error tidal raises on purpose."""


class SourceError(TidalError, FileNotFoundError):
    """A path, glob or URL that names no data."""


class FormatError(TidalError, ValueError):
    """A file whose format tidal cannot read as asked."""


class SchemaError(FormatError):
    """A column asked for (``columns=``) that the data does not have, or shards whose columns
    disagree. ``errors="skip"`` is for bad records, so this is raised under every policy."""


class RecordError(TidalError, ValueError):
    """A malformed record, or one a stage cannot use (a null where tokenize needs text);
    ``path`` and ``line`` (1-based) or ``row`` (0-based, the record's place in its file) say
    where (the message names the line where there is one). Built from a message alone (as torch does when re-raising a worker's error in the
    main process), the message is kept as it is.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        line: int | None = None,
        row: int | None = None,
    ):
        where = f"{path}, line {line}" if line is not None else f"{path}, row {row}" if row is not None else path
        super().__init__(f"{where}: {message}" if where else message)
        self.path, self.line, self.row = path, line, row


class StateError(TidalError, ValueError):
    """A saved state that does not describe this dataset or loader."""


class Untraceable(TidalError, NotImplementedError):
    """A pipeline whose provenance :func:`tidal.trace` cannot work out: names the step."""


class ArgumentError(TidalError, ValueError, TypeError):
    """An argument a method or class does not accept: raised when it is called, naming it and what
    it takes. Also a ``ValueError`` and a ``TypeError``, what Python's own functions raise."""


class MissingDependency(TidalError, ImportError):
    """An optional package a feature needs is not installed; the message names the ``pip install``."""


def needs(module: str, feature: str, extra: str | None = None, *, package: str | None = None) -> Any:
    """``import module``, or a :class:`MissingDependency` naming the ``pip install`` that adds it:
    tidal's ``extra`` (``pip install 'tidal[torch]'``), or ``package`` where no extra holds it.

    >>> yaml = needs("yaml", "a YAML config", "cli")
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(module, feature, exc, extra, package=package) from None


def missing(
    module: str, feature: str, exc: ImportError, extra: str | None = None, *, package: str | None = None
) -> MissingDependency:
    """The :class:`MissingDependency` for ``exc``, raised importing ``module`` for ``feature``;
    for module-level imports, which cannot go through :func:`needs`::

        try:
            import torch
        except ImportError as exc:
            raise missing("torch", "tidal.DataLoader", exc, "torch") from None
    """
    top = module.split(".")[0]
    install = f"pip install 'tidal[{extra}]'" if extra else f"pip install {package or top}"
    gone = getattr(exc, "name", None)
    if gone is None or gone == top or gone.startswith(top + "."):
        why = "which is not installed"
    else:  # installed, but something it imports is not (or is broken)
        why = f"which is installed but does not import ({type(exc).__name__}: {exc})"
    return MissingDependency(f"{feature} needs the {top} package, {why}: {install}")


class ConfigError(TidalError, ValueError):
    """A pipeline config (:mod:`tidal.config`) that is malformed, named by its key, or a dataset
    that cannot be written as one."""


class StorageError(TidalError, OSError):
    """A remote read that failed after its retries, or a local cache that cannot hold a shard.

    The message names the URL and what was tried (attempts, time, the last error), with
    credentials and signed query strings removed. ``url`` and ``attempts`` say the same
    for code. It is an ``OSError``, so code that handles I/O errors handles it too.
    """

    def __init__(self, message: str, *, url: str = "", attempts: int = 0, permanent: bool = False):
        super().__init__(message)
        self.url, self.attempts = url, attempts
        self.permanent = permanent  # refused for good (not found, denied): another try would not help

    def __reduce__(self) -> tuple:  # keep the message when pickled across processes
        return (_storage_error, (str(self), self.url, self.attempts, self.permanent))


def _storage_error(message: str, url: str, attempts: int, permanent: bool = False) -> StorageError:
    return StorageError(message, url=url, attempts=attempts, permanent=permanent)
