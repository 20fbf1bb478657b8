"""Reading a saved state back: every value checked, every error naming its key."""

from __future__ import annotations

from typing import Any

from tidal.errors import StateError

_MISSING: Any = object()


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class View:
    """A dict of a saved state being read, and where it sits in the whole, for errors.

    >>> View({"epoch": "x"}, "state").integer("epoch")
    StateError: state['epoch']: expected an integer, found 'x'
    """

    __slots__ = ("data", "path")

    def __init__(self, data: Any, path: str = "state"):
        if not isinstance(data, dict):
            raise StateError(f"{path}: expected an object, found {_shown(data)}")
        self.data: dict = data
        self.path = path

    def where(self, key: str | int) -> str:
        return f"{self.path}[{key!r}]"

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key not in self.data:
            if default is _MISSING:
                raise StateError(f"{self.where(key)} is missing")
            return default
        return self.data[key]

    def integer(self, key: str, lo: int = 0, hi: int | None = None, default: Any = _MISSING) -> int:
        """An integer in ``[lo, hi]``."""
        return check_int(self.get(key, default), self.where(key), lo, hi)

    def string(self, key: str, default: Any = _MISSING) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise StateError(f"{self.where(key)}: expected a string, found {_shown(value)}")
        return value

    def flag(self, key: str, default: Any = _MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise StateError(f"{self.where(key)}: expected true or false, found {_shown(value)}")
        return value

    def entries(self, key: str, length: int | None = None, default: Any = _MISSING) -> list:
        value = self.get(key, default)
        if not isinstance(value, list):
            raise StateError(f"{self.where(key)}: expected a list, found {_shown(value)}")
        if length is not None and len(value) != length:
            raise StateError(f"{self.where(key)}: expected {length} entries, found {len(value)}")
        return value

    def names(self, key: str, default: Any = _MISSING) -> list[str]:
        """A list of strings."""
        values = self.entries(key, default=default)
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise StateError(f"{self.where(key)}[{i}]: expected a string, found {_shown(v)}")
        return values

    def view(self, key: str, default: Any = _MISSING) -> View:
        """The dict under ``key``, as a view."""
        return View(self.get(key, default), self.where(key))

    def only(self, *keys: str) -> None:
        """No key but ``keys``: a key a state never has (a typo, a hand edit) is an error, not ignored."""
        for key in self.data:
            if key not in keys:
                raise StateError(f"{self.where(key)}: not a key of this part of a state (its keys: {', '.join(keys)})")

    def optional(self, key: str) -> View | None:
        """The dict under ``key``, or None where the key is missing or null."""
        value = self.data.get(key)
        return None if value is None else View(value, self.where(key))


def check_int(value: Any, where: str, lo: int = 0, hi: int | None = None) -> int:
    if type(value) is not int:  # bool is not a count
        raise StateError(f"{where}: expected an integer, found {_shown(value)}")
    if value < lo or (hi is not None and value > hi):
        bounds = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise StateError(f"{where}: {value} is out of range (expected {bounds})")
    return value
