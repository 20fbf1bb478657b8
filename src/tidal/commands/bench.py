"""``tidal bench URL``: how fast the user's own pipeline runs on their data, and whether a training
step would wait on it.

The pipeline is ``tidal.Dataset(URL)[.shuffle(SEED)].repeat()[.tokenize(TOK)][.pack(SEQ_LEN)]
.batch(N)`` (or a ``--config``), read through ``tidal.DataLoader`` with ``--workers`` when torch
is installed, else iterated in this process. Two phases, ``--seconds`` each:

1. **Throughput**: batches taken as fast as they come; records/s, tokens/s, MB/s (what the
   batches hold, and the source files' bytes at the rate their records are read), and the time
   from ``iter()`` to the first batch.
2. **A training loop** (with ``--step-time S``): after each batch the loop sleeps ``S`` seconds,
   as a training step would, while the workers keep reading; the share of the time the loop
   waited for its next batch is the data wait such a step would see.

Counts are taken over windows of the run for the plot: in the terminal always, and as a PNG
with ``--plot out.png``.

A finite pipeline (a ``--config`` without ``repeat``) is started again where it ends, as a
loop over epochs calls ``iter()`` again; the report says so, with the batches of a pass. An
option that does not apply is an error, never ignored: with ``--config`` the pipeline's own
steps (``--tokenize``, ``--column``, ``--pack``, ``--batch``, ``--shuffle``) and the source's
options are the config's; ``--workers`` needs torch (not ``--no-torch``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from tidal.commands import add_source, open_dataset, progress_on, rate, seconds, size
from tidal.commands.plot import Series, png, terminal
from tidal.errors import ArgumentError, MissingDependency
from tidal.progress import Bar

if TYPE_CHECKING:
    from tidal.dataset import Dataset

WINDOWS = 20  # windows per phase, for the plot (at least MIN_WINDOW seconds each)
MIN_WINDOW = 0.25


def add(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        parents=parents,
        help="the throughput of your pipeline on your data, and whether a training step would wait on it",
        description="Measure the pipeline Dataset(URL)[.shuffle(SEED)].repeat()[.tokenize(TOK)][.pack(SEQ_LEN)]"
        ".batch(N) (or a --config) through tidal.DataLoader (in this process when torch is not installed): "
        "records/s, tokens/s, MB/s and the time to the first batch; with --step-time S, the share of the time a "
        "training loop taking S per step would wait on data. Plots both over time.",
    )
    add_source(p, what="read")
    p.add_argument(
        "--tokenize", default=None, metavar="TOKENIZER", help="tokenizer.json (or its directory) to tokenize with"
    )
    p.add_argument(
        "--column",
        default=None,
        help="with --tokenize, the text column to tokenize (default text); without it, the column of token ids "
        "--pack packs (default input_ids)",
    )
    p.add_argument(
        "--pack", type=int, default=None, metavar="SEQ_LEN", help="pack token ids into sequences of SEQ_LEN tokens"
    )
    p.add_argument("--batch", type=int, default=None, metavar="N", help="records (or sequences) per batch (default 8)")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="DataLoader workers (default 2; 0: in the loop's process); needs torch",
    )
    p.add_argument(
        "--shuffle", type=int, default=None, metavar="SEED", help="shuffle with this seed (default: in order)"
    )
    p.add_argument("--seconds", type=float, default=10.0, metavar="S", help="how long each phase runs (default 10)")
    p.add_argument(
        "--step-time",
        type=float,
        default=None,
        metavar="S",
        help="simulate a training step of S seconds after each batch and measure the data wait",
    )
    p.add_argument("--plot", default=None, metavar="OUT.png", help="also draw the plot as a PNG")
    p.add_argument(
        "--no-torch", action="store_true", help="iterate the dataset in this process even when torch is installed"
    )
    p.set_defaults(run=run)


@dataclass
class Window:
    """What one stretch of the run delivered."""

    start: float  # seconds since the first batch
    seconds: float
    batches: int = 0
    records: int | None = None
    tokens: int = 0
    bytes: int = 0
    waited: float = 0.0


@dataclass
class Phase:
    windows: list[Window] = field(default_factory=list)

    def total(self, name: str) -> float:
        return sum(getattr(w, name) or 0 for w in self.windows)

    @property
    def seconds(self) -> float:
        return sum(w.seconds for w in self.windows)

    @property
    def has_records(self) -> bool:
        return all(w.records is not None for w in self.windows)


def pipeline(args: argparse.Namespace) -> Dataset:
    """The dataset the arguments describe."""
    if args.config is not None:
        given = [f"--{n}" for n in ("tokenize", "column", "pack", "batch", "shuffle") if getattr(args, n) is not None]
        if given:
            raise ArgumentError(f"{', '.join(given)}: the pipeline comes from --config; change it there")
        return open_dataset(args)
    if args.column is not None and not (args.tokenize or args.pack):
        raise ArgumentError("--column names the text --tokenize reads or the token ids --pack packs: give one of them")
    if args.tokenize and args.columns is None:
        args.columns = args.column or "text"  # read only the text
    ds = open_dataset(args)
    if args.shuffle is not None:
        ds = ds.shuffle(seed=args.shuffle)
    ds = ds.repeat()
    if args.tokenize:
        ds = ds.tokenize(args.tokenize, column=args.column or "text")
    if args.pack:
        ds = ds.pack(args.pack) if args.tokenize or args.column is None else ds.pack(args.pack, column=args.column)
    return ds.batch(args.batch or 8)


def run(args: argparse.Namespace) -> int:
    if args.seconds <= 0 or (args.batch is not None and args.batch < 1) or (args.workers or 0) < 0:
        raise ArgumentError("--seconds and --batch must be positive and --workers at least 0")
    if args.step_time is not None and args.step_time < 0:
        raise ArgumentError("--step-time cannot be negative")
    if args.no_torch and args.workers is not None:
        raise ArgumentError("--workers: with --no-torch the dataset is iterated in this process, without workers")
    torch = find_spec("torch") is not None and not args.no_torch
    if args.workers is not None and not torch:
        raise MissingDependency(
            "--workers reads through tidal.DataLoader, which needs torch: pip install 'tidal[torch]'"
        )
    began = time.perf_counter()
    ds = pipeline(args)
    opened = time.perf_counter() - began
    print(f"pipeline: {ds!r}")
    if torch:
        import tidal

        workers = 2 if args.workers is None else args.workers
        loader: Any = tidal.DataLoader(ds, num_workers=workers)
        print(f"through: tidal.DataLoader, {workers} worker(s)")
    else:
        loader = ds
        why = "--no-torch" if args.no_torch else "torch is not installed"
        print(f"through: the dataset iterated in this process ({why})")
    bar = Bar(args.seconds * (2 if args.step_time is not None else 1), "bench", "s", progress_on(args))
    started = time.perf_counter()
    batches = Batches(loader, ds.records_per_batch())
    try:
        next(batches)
        first_s = time.perf_counter() - started
        full = _phase(batches, args.seconds, None, batches.records, bar)
        loop = (
            _phase(batches, args.seconds, args.step_time, batches.records, bar) if args.step_time is not None else None
        )
    finally:
        bar.close()
        batches.close()
    print(_report(ds, full, loop, first_s, opened, args))
    if batches.passes:
        print(
            f"the pipeline is finite: a pass gives {batches.passes[0]:,} batches; it ended {len(batches.passes)} "
            "time(s) and was started again with iter(), as a loop over epochs does (each start is in the figures; "
            "add repeat to measure one endless pass)"
        )
    plots = _plots(full, loop)
    for series in plots:
        print()
        print(terminal(series))
    if args.plot:
        png(args.plot, plots)
        print(f"\nwrote {args.plot}")
    return 0


# -- counting ------------------------------------------------------------------------------------


class Batches:
    """The loader's batches for as long as they are asked for: where a finite pipeline ends, a new
    pass is started (``iter()`` again), and the batches of each pass that ended are kept in
    :attr:`passes`. A pipeline that yields no batch at all is an error."""

    def __init__(self, loader: Any, per_batch: int | None):
        self.loader, self.per_batch = loader, per_batch
        self.passes: list[int] = []  # batches of each pass that ended
        self.taken = 0  # batches of the pass in progress
        self._carried = 0  # source records of the passes that ended
        self._it = iter(loader)

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            if not self.taken:
                raise ArgumentError(
                    "the pipeline yields no batch (fewer records than a batch?): nothing to measure"
                ) from None
            self._carried += self._state_records() or 0
            self.passes.append(self.taken)
            self.close()
            self.taken, self._it = 0, iter(self.loader)
            return next(self)
        self.taken += 1
        return batch

    def records(self, batches: int) -> int | None:
        """Source records consumed once ``batches`` batches are taken: the batches times the records
        in each where that is fixed, else what the loader's state counts (None if nothing)."""
        if self.per_batch is not None:
            return batches * self.per_batch
        now = self._state_records()
        return None if now is None else self._carried + now

    def _state_records(self) -> int | None:
        state = self.loader.state_dict()  # tidal.DataLoader's, or the dataset's latest iterator's
        return _records_of(state) if state else None

    def close(self) -> None:
        closer = getattr(self._it, "close", None) or getattr(self._it, "_shutdown_workers", None)
        if closer is not None:
            closer()


def _records_of(state: dict) -> int | None:
    """Source records a state says were consumed: the sum of every reader's ``counts.records``."""
    from tidal.state import keys as k

    if k.RANKS not in state:
        return state.get(k.COUNTS, {}).get(k.RECORDS)
    total = 0
    for rank in state[k.RANKS]:
        for worker in (rank or {}).get(k.WORKERS) or []:
            if worker:
                total += worker[k.COUNTS][k.RECORDS]
    return total


def _measure(batch: Any) -> tuple[int, int]:
    """(tokens, bytes) of a batch: ``input_ids`` elements; the bytes of every array, string and blob."""
    tokens = 0
    if isinstance(batch, dict):
        ids = batch.get("input_ids")
        if ids is not None and hasattr(ids, "shape"):
            tokens = int(ids.numel()) if hasattr(ids, "numel") else int(ids.size)
    return tokens, _bytes(batch)


def _bytes(value: Any) -> int:
    if isinstance(value, dict):
        return sum(_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(value, "element_size"):  # a torch tensor
        return int(value.element_size() * value.nelement())
    return 0


def _phase(batches: Iterator[Any], duration: float, step: float | None, counter: Any, bar: Bar) -> Phase:
    """Batches for ``duration`` seconds, counted in windows; with ``step``, a sleep of ``step`` seconds
    after each, as a training step would take. ``counter(batches taken)``: source records consumed so far, or None."""
    phase = Phase()
    window = max(duration / WINDOWS, MIN_WINDOW)
    start = time.perf_counter()
    taken = 0  # batches taken in this phase
    before = counter(taken)
    current = Window(0.0, 0.0)
    while time.perf_counter() - start < duration:
        t0 = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            break
        current.waited += time.perf_counter() - t0
        tokens, nbytes = _measure(batch)
        current.batches += 1
        taken += 1
        current.tokens += tokens
        current.bytes += nbytes
        if step:
            time.sleep(step)
        now = time.perf_counter()
        if now - start - current.start >= window:
            before = _close(phase, current, now - start, counter(taken), before, bar)
            current = Window(now - start, 0.0)
    if current.batches:
        _close(phase, current, time.perf_counter() - start, counter(taken), before, bar)
    return phase


def _close(phase: Phase, window: Window, end: float, after: int | None, before: int | None, bar: Bar) -> int | None:
    window.seconds = end - window.start
    window.records = after - before if after is not None and before is not None else None
    phase.windows.append(window)
    bar.update(window.seconds)
    return after


# -- what is printed -----------------------------------------------------------------------------


def _report(
    ds: Dataset, full: Phase, loop: Phase | None, first_s: float, opened: float, args: argparse.Namespace
) -> str:
    lines = [f"first batch: {seconds(first_s)} after iter() (workers start, shards open, the first block is read); "
             f"building the dataset (index): {seconds(opened)}"]  # fmt: skip
    t = full.seconds or 1e-9
    parts = [f"{rate(full.total('batches') / t)} batches/s"]
    if full.has_records:
        parts.append(f"{rate(full.total('records') / t)} records/s")
    if full.total("tokens"):
        parts.append(f"{rate(full.total('tokens') / t)} tokens/s")
    parts.append(f"{size(full.total('bytes') / t)}/s in batches")
    sources = ds.sources().values()
    records, nbytes = sum(p.total for p in sources), sum(int(p.shards.bytes.sum()) for p in sources)
    if full.has_records and records:
        parts.append(f"{size(full.total('records') / t * nbytes / records)}/s of source files")
    lines.append(f"throughput over {seconds(full.seconds)} after the first batch: " + ", ".join(parts))
    per_batch = full.seconds / max(1, full.total("batches"))
    if loop is None:
        lines.append(
            f"a batch every {seconds(per_batch)}: a training step longer than that should not wait on data "
            "(measure it: --step-time S)"
        )
    else:
        waited, span = loop.total("waited"), loop.seconds or 1e-9
        steps = int(loop.total("batches"))
        verdict = "waits on data" if waited / span > 0.01 else "does not wait on data"
        lines.append(
            f"a training step of {seconds(args.step_time)} {verdict}: {waited / span:.1%} of the time waiting "
            f"({seconds(waited)} over {steps} steps in {seconds(span)})"
        )
    return "\n".join(lines)


def _plots(full: Phase, loop: Phase | None) -> list[Series]:
    """Throughput at full speed over time; with a training step, the data wait over time."""
    windows = full.windows
    times = [w.start + w.seconds / 2 for w in windows]
    if windows and all(w.tokens for w in windows):
        name, values = "tokens/s", [w.tokens / w.seconds for w in windows]
    elif windows and all(w.records is not None for w in windows):
        name, values = "records/s", [(w.records or 0) / w.seconds for w in windows]
    else:
        name, values = "batches/s", [w.batches / w.seconds for w in windows]
    out = [Series(f"throughput at full speed, {name}", times, values)]
    if loop is not None:
        out.append(
            Series(
                "data wait of the training loop: share of the time it waited for a batch",
                [w.start + w.seconds / 2 for w in loop.windows],
                [w.waited / w.seconds for w in loop.windows],
                percent=True,
            )
        )
    return out
