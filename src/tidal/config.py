"""Declarative pipelines: a dataset's chain as plain data (JSON, YAML or TOML), and back.

``ds.to_config()`` writes the chain; ``tidal.Dataset.from_config(config)`` builds it again,
the same dataset (the same fingerprint, so the same batches, and saved states restore into
it). ``tidal.DataLoader.from_config(config)`` also reads the ``loader`` section. The schema::

    version: 1
    source:                          # the files: tidal.Dataset(...)'s arguments
      src: data/web                  # a path, directory, glob, URL or a list, as given
      columns: [text]
      format: jsonl                  # also errors ("raise", "skip" or a function's import path),
                                     # format_options, follow_links
      storage_options: {endpoint_url: "https://minio.internal:9000"}
      cache_dir: /nvme/tidal-cache   # and cache_limit; storage: {timeout, prefetch, retry: {...}, ...}
    steps:                           # the chained calls, in order: {method: {argument: value}}
      - shuffle: {seed: 42}
      - repeat: {}                   # epochs left out (or null): forever
      - filter: {fn: "my_package.filters:is_long"}   # functions by import path
      - tokenize: {tokenizer: tokenizer.json}        # or {tokenizer: {json: "<tokenizer.json text>"}}
      - pack: {seq_len: 2048}
      - batch: {size: 8, continuous: true}
    loader: {num_workers: 4, pin_memory: true}       # tidal.DataLoader.from_config only

A mixture takes the place of ``source``, each stream a pipeline of its own (``source`` or
``mix``, and ``steps``)::

    mix:
      streams: {web: {source: ..., steps: [...]}, code: {source: ..., steps: [...]}}
      weights: {web: 0.7, code: 0.3}     # or {linear: {start: {...}, end: {...}, steps: n}},
                                         # {cosine: ...}, {piecewise: [[0, {...}], [n, {...}]]}
      seed: 0                            # and stop, choose, repeat, epoch_size: tidal.mix's

A step with no arguments may be written as its name alone (``- repeat``); a value left out
(or null) takes the method's default (TOML has no null: leave the key out). Every key is
checked: an unknown or misspelled key is a :class:`~tidal.errors.ConfigError` that names it
(``config['steps'][2]['pack']['seq_lenn']: unknown key; known: seq_len, ...``), never ignored.

What a config never holds: credentials. ``to_config()`` leaves out of ``storage_options``
every key that names one (``key``, ``secret``, ``token``, ``password``, the AWS keys of
``client_kwargs``, ``Authorization`` headers...) and any value that is not plain data, and
lists what it left out in ``storage_options_removed``; give them as usual (environment,
profiles, instance roles) where the config is used. A function given to ``map``/``filter``
is written as its import path, so a lambda or a local function cannot be (an error names
it); a tokenizer object that was not loaded from a path is embedded as its JSON.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from tidal.errors import ConfigError, MissingDependency, SourceError, TidalError, needs
from tidal.stages import Declared, Stage
from tidal.stages.batch import Batch
from tidal.stages.continuous import ContinuousBatch
from tidal.stages.mix import SCHEDULES
from tidal.stages.mix import mix as mix_stage
from tidal.stages.pack import Pack
from tidal.stages.read import Repeat, Shuffle
from tidal.stages.tokenize import Tokenize
from tidal.stages.transform import Filter, Map, resolve
from tidal.storage.config import Storage
from tidal.storage.retry import Retry
from tidal.storage.urls import is_remote, local_path

VERSION = 1

D = TypeVar("D")  # what a config builds: tidal.Dataset (given to build(), never imported here)

# -- the schema: every key a config may hold, per section (required keys first) --------------
# Each section is read from where its keys are declared: the steps' dataclasses, the source's
# and the mixture's functions, the storage settings' fields. Only the loader's keys are chosen
# here, from the keyword arguments torch's DataLoader takes.


def _parameters(fn: Callable, skip: tuple[str, ...] = ("self",)) -> tuple[str, ...]:
    """The names of ``fn``'s parameters, in order, but ``skip``."""
    return tuple(p for p in inspect.signature(fn).parameters if p not in skip)


def steps_schema(kinds: Iterable[type[Declared]]) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """``{method: (required, optional)}`` of the steps ``kinds`` declare (see
    :class:`tidal.stages.Declared`); kinds made by the same method (``batch`` and
    ``batch(continuous=True)``) share its keys, those of the first kind first."""
    schema: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for kind in kinds:
        required, optional = kind.arguments()
        known_required, known_optional = schema.get(kind.METHOD, ((), ()))
        required = known_required + tuple(a for a in required if a not in known_required + known_optional)
        optional = known_optional + tuple(a for a in optional if a not in required + known_optional)
        schema[kind.METHOD] = (required, optional)
    return schema


KINDS: tuple[type[Declared], ...] = (Shuffle, Repeat, Map, Filter, Tokenize, Pack, Batch, ContinuousBatch)
"""Every kind of step a config holds, in the order ``unknown step`` errors list them."""

TOP = ("version", "source", "mix", "steps", "loader")
PIPELINE = ("source", "mix", "steps")  # a stream of a mixture
REMOVED = "storage_options_removed"  # written by to_config() in the source, for the reader; not used
STEPS = steps_schema(KINDS)  # method: (required, optional)
MIX = _parameters(mix_stage)  # streams, weights, seed, ...: tidal.mix's (its datasets are the streams)
_GIVEN_APART = ("options", "cache_dir", "cache_limit")  # Storage fields the source takes as its own keys
STORAGE = tuple(  # the nested retry section last
    sorted((f.name for f in fields(Storage) if f.name not in _GIVEN_APART), key=lambda n: n == "retry")
)
RETRY = tuple(f.name for f in fields(Retry))
SCHEDULE = {
    name: () if name == "piecewise" else tuple(f.name for f in fields(kind))  # type: ignore[arg-type]
    for name, kind in SCHEDULES.items()
}
LOADER = (
    "num_workers",
    "batch_size",
    "drop_last",
    "prefetch_factor",
    "pin_memory",
    "pin_memory_device",
    "persistent_workers",
    "multiprocessing_context",
    "timeout",
    "device",
    "prefetch_to_device",
)


def source_keys(make: Callable) -> tuple[str, ...]:
    """The keys of a ``source`` section: the arguments of ``make`` (:class:`tidal.Dataset`), and
    what ``to_config()`` notes of credentials it left out."""
    return (*_parameters(make), REMOVED)


def describe(stage: Stage) -> dict:
    """The chain down from ``stage`` (a dataset's :attr:`~tidal.Dataset.stage`) as a config (see
    the module's docstring): plain, JSON-able data, its local paths absolute (:func:`absolute`)."""
    return absolute({"version": VERSION, **stage.to_config()})


def absolute(section: dict) -> dict:
    """``section`` (a config, or a mixture's stream) with every local path made absolute, as the
    dataset read it (against the directory it was made in): a config written by ``to_config()``
    reads the same files from any directory (``tidal trace``, ``tidal state verify`` run
    elsewhere). URLs are left as they are. Changed in place, and returned."""
    source = section.get("source")
    if isinstance(source, dict):
        if "src" in source:
            source["src"] = (
                [_absolute(s) for s in source["src"]] if isinstance(source["src"], list) else _absolute(source["src"])
            )
        if isinstance(source.get("cache_dir"), str):
            source["cache_dir"] = _absolute(source["cache_dir"])
        storage = source.get("storage")
        if isinstance(storage, dict) and isinstance(storage.get("index_url"), str):
            storage["index_url"] = _absolute(storage["index_url"])
    mix = section.get("mix")
    if isinstance(mix, dict) and isinstance(mix.get("streams"), dict):
        for stream in mix["streams"].values():
            if isinstance(stream, dict):
                absolute(stream)
    for step in section.get("steps") or []:
        args = step.get("tokenize") if isinstance(step, dict) else None
        if isinstance(args, dict) and isinstance(args.get("tokenizer"), str):
            args["tokenizer"] = _absolute(args["tokenizer"])
    return section


def _absolute(path: Any) -> Any:
    """A local path (``~`` and ``file://`` too) as an absolute one; a URL, or what is not a path, as it is."""
    if not isinstance(path, str) or is_remote(path):
        return path
    return os.path.abspath(os.path.expanduser(local_path(path)))


def load(config: Mapping | str | os.PathLike) -> dict:
    """A config from a dict (copied) or a ``.json``, ``.yaml``/``.yml`` or ``.toml`` file."""
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"a config is a dict or the path of a JSON, YAML or TOML file, not {type(config).__name__}")
    path = Path(config)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml", ".toml"):
        raise ConfigError(f"{path}: a config file ends in .json, .yaml, .yml or .toml")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SourceError(f"{path}: no such config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: the config file cannot be read: {exc.strerror or exc}") from None
    try:
        if suffix == ".json":
            data = json.loads(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = needs("yaml", "a YAML config", "cli").safe_load(text)
    except MissingDependency:
        raise
    except Exception as exc:  # a syntax error of any of the three
        raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top, found {type(data).__name__}")
    return data


def build(config: dict, dataset: Callable[..., D], mix: Callable[..., D]) -> D:
    """The dataset a checked config describes; ``dataset`` and ``mix`` make sources and mixtures."""
    section = _Section(config, "config")
    section.keys(TOP)
    version = config.get("version", VERSION)
    if version != VERSION:
        raise ConfigError(f"{section.where('version')}: version {version!r} is not {VERSION}")
    if "loader" in config:
        _Section(section.mapping("loader"), section.where("loader")).keys(LOADER)
    return _pipeline(section, dataset, mix)


def loader_settings(config: dict) -> dict:
    """The ``loader`` section of a config: keyword arguments of :class:`tidal.DataLoader`."""
    settings = config.get("loader") or {}
    section = _Section(settings, "config['loader']")
    section.keys(LOADER)
    return dict(settings)


class _Section:
    """A mapping of a config being read, and where it sits, for errors."""

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping, found {_shown(data)}")
        self.data, self.path = data, where

    def where(self, key: str | int) -> str:
        return f"{self.path}[{key!r}]"

    def keys(self, known: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
        for key in self.data:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{self.where(key)}: unknown key; known: {', '.join(known)}{hint}")
        for key in required:
            if key not in self.data:
                raise ConfigError(f"{self.where(key)} is missing")

    def mapping(self, key: str) -> dict:
        value = self.data[key]
        if not isinstance(value, dict):
            raise ConfigError(f"{self.where(key)}: expected a mapping, found {_shown(value)}")
        return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _pipeline(section: _Section, dataset: Callable[..., D], mix: Callable[..., D]) -> D:
    data = section.data
    if ("source" in data) == ("mix" in data):
        raise ConfigError(f"{section.path}: give either 'source' (files) or 'mix' (a mixture), not both or neither")
    ds = _source(section, dataset) if "source" in data else _mix(section, dataset, mix)
    steps = data.get("steps") or []
    if not isinstance(steps, list):
        raise ConfigError(f"{section.where('steps')}: expected a list of steps, found {_shown(steps)}")
    for i, step in enumerate(steps):
        where = f"{section.where('steps')}[{i}]"
        name, args = _step(step, where)
        try:
            ds = getattr(ds, name)(**args)
        except ConfigError:
            raise
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}[{name!r}]: {exc}") from None
    return ds


def _step(step: Any, where: str) -> tuple[str, dict]:
    """A step's method and its arguments, each key checked; functions and tokenizers resolved."""
    if isinstance(step, str):
        step = {step: {}}
    if not isinstance(step, dict) or len(step) != 1:
        raise ConfigError(f"{where}: a step is one method and its arguments, e.g. {{'batch': {{'size': 8}}}}")
    ((name, args),) = step.items()
    if name not in STEPS:
        close = difflib.get_close_matches(str(name), list(STEPS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{where}: unknown step {name!r}; known: {', '.join(STEPS)}{hint}")
    section = _Section({} if args is None else args, f"{where}[{name!r}]")
    required, optional = STEPS[name]
    section.keys(required + optional, required)
    args = {k: v for k, v in section.data.items() if v is not None}
    if "fn" in args:
        try:
            args["fn"] = resolve(args["fn"])
        except ConfigError as exc:
            raise ConfigError(f"{section.where('fn')}: {exc}") from None
    if name == "tokenize" and isinstance(args["tokenizer"], dict):
        _Section(args["tokenizer"], section.where("tokenizer")).keys(("json",), ("json",))
    return name, args


def _source(section: _Section, dataset: Callable[..., D]) -> D:
    source = _Section(section.mapping("source"), section.where("source"))
    source.keys(source_keys(dataset), ("src",))
    args = {k: v for k, v in source.data.items() if v is not None and k != REMOVED}
    if isinstance(args.get("errors"), str) and args["errors"] not in ("raise", "skip"):
        try:  # an errors= function, by import path as map's and filter's
            args["errors"] = resolve(args["errors"])
        except ConfigError as exc:
            raise ConfigError(f"{source.where('errors')}: 'raise', 'skip' or {exc}") from None
    src = args["src"]
    if not (isinstance(src, str) or (isinstance(src, list) and src and all(isinstance(s, str) for s in src))):
        raise ConfigError(
            f"{source.where('src')}: expected a path, URL or glob, or a list of them, found {_shown(src)}"
        )
    if "storage" in args:
        storage = _Section(source.mapping("storage"), source.where("storage"))
        storage.keys(STORAGE)
        settings = dict(storage.data)
        try:
            if "retry" in settings:
                retry = _Section(storage.mapping("retry"), storage.where("retry"))
                retry.keys(RETRY)
                settings["retry"] = Retry(**retry.data)
            args["storage"] = Storage(**settings)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{source.where('storage')}: {exc}") from None
    try:
        return dataset(**args)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{source.path}: {exc}") from None
    except TidalError as exc:  # files not found, a bad format...: the error as it is, and where it came from
        exc.add_note(f"(from {source.path})")
        raise


def _mix(section: _Section, dataset: Callable[..., D], mix: Callable[..., D]) -> D:
    spec = _Section(section.mapping("mix"), section.where("mix"))
    spec.keys(MIX, ("streams",))
    streams = _Section(spec.mapping("streams"), spec.where("streams"))
    if not streams.data:
        raise ConfigError(f"{streams.path}: a mixture needs at least one stream")
    built = {}
    for name in streams.data:
        stream = _Section(streams.mapping(name), streams.where(name))
        stream.keys(PIPELINE)
        built[str(name)] = _pipeline(stream, dataset, mix)
    args = {k: v for k, v in spec.data.items() if v is not None and k != "streams"}
    if isinstance(args.get("weights"), dict) and len(args["weights"]) == 1:
        ((kind, value),) = args["weights"].items()
        if kind in SCHEDULE and kind not in built:
            args["weights"] = _schedule(kind, value, spec.where("weights"))
    try:
        return mix(built, **args)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{spec.path}: {exc}") from None


def _schedule(kind: str, value: Any, where: str) -> Any:
    where = f"{where}[{kind!r}]"
    cls = SCHEDULES[kind]
    if kind == "piecewise":
        pairs = isinstance(value, list) and value and all(isinstance(p, list) and len(p) == 2 for p in value)
        if not pairs or not all(isinstance(p[0], int) and isinstance(p[1], dict) for p in value):
            raise ConfigError(f"{where}: expected a list of [records drawn, {{stream: weight}}], found {_shown(value)}")
        return cls([(start, weights) for start, weights in value])  # type: ignore[call-arg]
    section = _Section(value, where)
    section.keys(SCHEDULE[kind], SCHEDULE[kind])
    return cls(**section.data)
