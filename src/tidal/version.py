"""The version of tidal, on the ground floor: the index records which tidal wrote it."""

__version__ = "0.1.0"
