"""The commands of ``tidal``, one module each, and what they share.

Each command module has ``add(subparsers)``, which declares its arguments (with help on every
one) and sets ``run``: a function of the parsed arguments that returns the exit status.
:mod:`tidal.cli` only builds the parser from them and turns errors into one line.

What the commands share lives here: the arguments that name a dataset (a URL, ``--format``,
``--columns``, ``--storage-option``, ``--cache-dir``, ``--config``) and opening it, with a
progress bar while it is indexed; what a replay of a saved run reads (a state file, and the
pipeline config its loader ran: ``tidal trace``, ``tidal state verify``); the progress bars
themselves (tqdm, the ``cli`` extra, on stderr when it is a terminal or with ``--progress``);
sizes and rates as text.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.errors import ArgumentError, needs

if TYPE_CHECKING:
    from tidal.dataset import Dataset

MODULES = (
    "tidal.commands.inspect",
    "tidal.commands.index",
    "tidal.commands.bench",
    "tidal.commands.plan",
    "tidal.convert.cli",
    "tidal.commands.state",
    "tidal.commands.trace",
    "tidal.commands.demo",
)


# -- the arguments that name a dataset ---------------------------------------------------------


def add_source(p: argparse.ArgumentParser, *, what: str) -> None:
    """URL, ``--config`` and the options of ``tidal.Dataset`` that a command line can give."""
    p.add_argument(
        "url",
        nargs="?",
        default=None,
        metavar="URL",
        help=f"the data to {what}: a file, directory, glob or fsspec URL (s3://, gs://, hf://datasets/...), as tidal.Dataset reads it",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="PIPELINE",
        help="a pipeline config (.yaml, .json, .toml; see tidal.Dataset.from_config) instead of URL",
    )
    p.add_argument("--format", default=None, help="the files' format, where their endings do not tell (e.g. jsonl)")
    p.add_argument("--columns", default=None, help="comma-separated columns to read (default: all)")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec storage option, repeatable: endpoint_url=http://..., anon=true, "
        "client_kwargs.region_name=eu-west-1 (a dotted key nests; a value is JSON where it parses, else a string)",
    )
    p.add_argument(
        "--cache-dir", default=None, help="the shard cache for remote data (default ~/.cache/tidal/shards/...)"
    )
    p.add_argument(
        "--follow-links",
        action="store_true",
        help="read files that symbolic links under a directory lead to outside it (tidal.Dataset's follow_links=True)",
    )
    add_progress(p)


SOURCE_OPTIONS = (
    ("--format", "format"),
    ("--columns", "columns"),
    ("--storage-option", "storage_option"),
    ("--cache-dir", "cache_dir"),
    ("--follow-links", "follow_links"),
)
"""The options of :func:`add_source` that describe the source: a config holds its own."""


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars on stderr (default: when stderr is a terminal; tqdm draws them: pip install 'tidal[cli]')",
    )


def storage_options(pairs: list[str]) -> dict[str, Any]:
    """``["a=1", "client_kwargs.region_name=x"]`` as ``{"a": 1, "client_kwargs": {"region_name": "x"}}``.

    >>> storage_options(["anon=true", "endpoint_url=http://127.0.0.1:9000"])
    {'anon': True, 'endpoint_url': 'http://127.0.0.1:9000'}
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ArgumentError(f"--storage-option {pair.split('=')[0]!r}: expected KEY=VALUE")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        *parents, last = key.strip().split(".")
        where = out
        for name in parents:
            inner = where.setdefault(name, {})
            if not isinstance(inner, dict):
                raise ArgumentError(f"--storage-option {key}: {name} is given both as a value and as a group")
            where = inner
        where[last] = value
    return out


def columns(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def listed(error: Exception) -> None:
    """An ``errors=`` policy for commands that show data: a file that cannot be read is counted
    and shown as unreadable (``Shard.error``), not fatal; a bad record is still an error."""
    from tidal.errors import RecordError

    if isinstance(error, RecordError):
        raise error


def open_dataset(args: argparse.Namespace, errors: Any = "raise") -> Dataset:
    """The dataset the arguments name: ``--config``, else URL with the options given.

    With progress bars on, the dataset indexes its files under a bar.
    """
    from tidal.dataset import Dataset

    if args.config is not None:
        if args.url is not None:
            raise ArgumentError("give URL or --config PIPELINE, not both")
        given = [flag for flag, dest in SOURCE_OPTIONS if getattr(args, dest, None)]
        if given:
            raise ArgumentError(f"{', '.join(given)}: the source comes from --config PIPELINE; set it there")
        return Dataset.from_config(args.config)
    if args.url is None:
        raise ArgumentError("give a URL (a file, directory, glob or fsspec URL) or --config PIPELINE")
    options = storage_options(args.storage_option)
    follow = bool(getattr(args, "follow_links", False))
    kwargs: dict[str, Any] = {"storage_options": options or None, "cache_dir": args.cache_dir, "follow_links": follow}
    return Dataset(args.url, columns(args.columns), args.format, errors, progress=progress_on(args), **kwargs)


# -- a saved run: its states and its pipeline (tidal trace, tidal state) ---------------------------


def read_state(path: str) -> dict:
    """A state file's JSON object; errors name the file (missing, unreadable, not JSON and where
    the JSON breaks, not an object)."""
    from tidal.provenance import load_state

    return load_state(Path(path))


def add_pipeline(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        required=True,
        metavar="PIPELINE",
        help="the pipeline config the state was saved with (.yaml, .json, .toml; see tidal.Dataset.from_config); "
        "its loader batch_size applies as tidal.DataLoader.from_config applies it",
    )


def pipeline(config: str) -> Dataset:
    """The dataset ``tidal.DataLoader.from_config(config)`` iterates: the config's chain, batched
    by its loader ``batch_size`` where it has one."""
    from tidal import config as schema
    from tidal.dataset import Dataset

    data = schema.load(config)
    ds = Dataset.from_config(data)
    settings = schema.loader_settings(data)
    if settings.get("batch_size") is not None:
        ds = ds.batch(settings["batch_size"], drop_last=bool(settings.get("drop_last", False)))
    return ds


# -- progress bars -------------------------------------------------------------------------------


def progress_on(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars: ``--progress`` (tqdm must then be there to draw them), else
    when stderr is a terminal and tqdm is installed."""
    flag = getattr(args, "progress", None)
    if flag:
        needs("tqdm", "--progress", "cli")
    return sys.stderr.isatty() if flag is None else bool(flag)


# -- numbers as text -----------------------------------------------------------------------------


def size(n: float) -> str:
    """Bytes as text, powers of 1000: ``size(1_234_000) == "1.23 MB"``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def rate(n: float) -> str:
    """A count per second as text: ``rate(1_234_567) == "1.23M"``."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def seconds(t: float) -> str:
    if t < 1:
        return f"{t * 1000:.3g} ms"
    if t < 120:
        return f"{t:.3g} s"
    if t < 7200:
        return f"{t / 60:.3g} min"
    return f"{t / 3600:.3g} h"
