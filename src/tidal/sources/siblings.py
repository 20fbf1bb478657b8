"""What a remote file's format is decided by, or read with, beside it (:class:`Siblings`)."""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

from tidal import fork_safe
from tidal.errors import SourceError, StorageError


class Siblings:
    """What a remote file's format is decided by, or read with, beside it: whether a sibling
    exists (a LitData ``index.json``, a Megatron ``.idx``) and a manifest's bytes, each asked
    of the store once per count (``of(fetcher)``), however many files share the directory."""

    _made: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()
    _made_lock: ClassVar[fork_safe.Lock] = fork_safe.Lock()

    def __init__(self, fetcher: Any):
        self._fetcher = fetcher
        self._lock = fork_safe.Lock()
        self._answers: dict[tuple[str, str], Any] = {}  # (what was asked, url): what the store said

    @classmethod
    def of(cls, fetcher: Any) -> Siblings:
        with cls._made_lock:
            made = cls._made.get(fetcher)
            if made is None:
                made = cls._made[fetcher] = cls(fetcher)
            return made

    def exists(self, url: str) -> bool:
        return self.stat(url) is not None

    def stat(self, url: str) -> Any:
        """The sibling's ``FileStat`` (size, version); None where there is none."""
        return self._ask("stat", url)

    def read(self, url: str) -> bytes | None:
        return self._ask("cat", url)

    def _ask(self, call: str, url: str) -> Any:
        """``remote.<call>(url)``, once; None where there is no such file (or it is not ours to read)."""
        with self._lock:
            if (call, url) not in self._answers:
                try:
                    found = getattr(self._fetcher.remote(url), call)(url)
                except SourceError:
                    found = None
                except StorageError as exc:
                    if not exc.permanent:
                        raise
                    found = None
                self._answers[(call, url)] = found
            return self._answers[(call, url)]
