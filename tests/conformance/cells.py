"""The feature space, and a cell of it drawn from a seed.

A :class:`Cell` is one combination of what users combine: a source (format, local or S3, the
shape of its files), the stages of the chain, the ``errors=`` policy, the loader and its
topology, and how the run is resumed. :func:`draw` picks one at random from a seed, within
the constraints the features have (``pack`` needs token ids, ``continuous`` needs ``pack``,
the JAX loader needs whole batches, ...), so a cell is its seed: ``draw(seed)`` gives it back
anywhere, and ``make conformance CELLS=1 SEED=<seed>`` runs it again.

A named case of the fixed sample is a drawn cell with some axes set by hand
(``dataclasses.replace``): the minimal cell that showed a defect.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from conformance.data import BAD_FORMATS, EMPTY_FORMATS, FORMATS, OPTIONAL_FORMATS, TEXT_FORMATS, TOKEN_FORMATS

LOADERS = ("none", "torch0", "fork2", "spawn2", "jax")
WORKERS = {"none": 1, "torch0": 1, "fork2": 2, "spawn2": 2, "jax": 2, "jax1": 1}  # readers per rank


@dataclass(frozen=True)
class Cell:
    """One pipeline and topology; every field is a plain value, so a cell prints as its recipe."""

    seed: int
    # source
    fmt: str = "jsonl"
    storage: str = "local"  # or "s3": the moto server
    shape: str = "files"  # see conformance.data.SHAPES
    size: int = 120  # records, about
    # a second stream, mixed with the first (same format): its shape, or None for no mixture
    mix: str | None = None
    weights: tuple[float, float] = (1.0, 1.0)
    stop: str = "first_exhausted"
    tokenize_before_mix: bool = False
    set_weights: tuple[int, tuple[float, float]] | None = None  # at this step, these weights
    # stages
    shuffle: int | None = None  # the seed, or None: in order
    block_size: int = 16384
    epochs: int = 1
    map: bool = False
    filter: bool = False
    tokenize: bool = False
    pack: str | None = None  # "concat" or "best_fit"
    seq_len: int = 16
    buffer_size: int = 4
    batch: int | None = 4  # None: records one by one
    drop_last: bool = False
    continuous: bool = False
    errors: str = "raise"  # "skip", or "function": a function that records each error and skips it
    # loader and topology
    loader: str = "torch0"
    ranks: int = 1
    # resume: "none", "same" (same topology, at step `at` of rank 0's batches), "elastic" (saved on
    # this topology, restored on `ranks_after` x `loader_after`)
    resume: str = "none"
    at: float = 0.5  # where the state is saved, as a share of the pass's batches
    ranks_after: int = 1
    loader_after: str = "torch0"

    @property
    def packed(self) -> bool:
        return self.pack is not None

    @property
    def tokens(self) -> bool:
        """Whether the rows hold token ids (tokenized, or token files)."""
        return self.tokenize or self.fmt in TOKEN_FORMATS

    @property
    def readers(self) -> int:
        return self.ranks * WORKERS[self.loader]

    def command(self) -> str:
        """The command that runs this cell alone (a named case: its test)."""
        return f"make conformance CELLS=1 SEED={self.seed}"

    def describe(self) -> str:
        """The axes that differ from the defaults, one line."""
        base = Cell(self.seed)
        parts = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name != "seed" and getattr(self, f.name) != getattr(base, f.name)
        ]
        return f"Cell(seed={self.seed}, " + ", ".join(parts) + ")"


def draw(seed: int) -> Cell:
    """The cell of ``seed``: each axis drawn in turn, later ones within what earlier ones allow."""
    rng = random.Random(seed)
    pick = rng.choice

    fmt = pick(FORMATS)
    shapes = ["files", "small", "large"]
    shapes += ["bad"] * 2 if fmt in BAD_FORMATS else []
    shapes += ["optional"] if fmt in OPTIONAL_FORMATS else []
    shapes += ["empty"] if fmt in EMPTY_FORMATS else []
    shape = pick(shapes)
    storage = "s3" if rng.random() < 0.2 else "local"
    size = rng.randint(40, 200)

    tokenize = fmt in TEXT_FORMATS and rng.random() < 0.5
    tokens = tokenize or fmt in TOKEN_FORMATS
    pack = pick([None, "concat", "best_fit"]) if tokens else None
    loader = pick(LOADERS)
    batch: int | None = rng.randint(1, 5)
    if loader in ("none", "torch0") and not pack and rng.random() < 0.15:
        batch = None
    continuous = pack is not None and batch is not None and rng.random() < 0.25
    if continuous:  # a rank's workers share its rows evenly (tidal.stages.continuous)
        batch = 2 * rng.randint(1, 2)
    drop_last = loader == "jax" or continuous or rng.random() < 0.3

    mix = pick(shapes) if rng.random() < 0.3 else None
    set_weights = None
    if mix is not None and loader != "none" and rng.random() < 0.5:
        set_weights = (rng.randint(1, 4), (rng.choice([0.2, 1.0, 3.0]), rng.choice([0.5, 1.0, 2.0])))

    bad = "bad" in (shape, mix)
    errors = pick(["raise", "skip", "function", "function"]) if bad else pick(["raise", "raise", "skip"])

    ranks = pick([1, 1, 2])
    resume = pick(["none", "same", "same", "elastic"])
    ranks_after, loader_after = ranks, loader
    if resume == "elastic":
        if loader == "none":
            resume = "same"
        elif rng.random() < 0.5:
            ranks_after = 3 - ranks
        else:
            loader_after = {"torch0": "fork2", "fork2": "torch0", "spawn2": "torch0", "jax": "jax1"}[loader]
    return Cell(
        seed=seed,
        fmt=fmt,
        storage=storage,
        shape=shape,
        size=size,
        mix=mix,
        weights=(pick([1.0, 2.0, 0.5]), 1.0),
        stop=pick(["first_exhausted", "all_exhausted"]),
        tokenize_before_mix=tokenize and rng.random() < 0.5,
        set_weights=set_weights,
        shuffle=rng.randint(0, 99) if rng.random() < 0.8 else None,
        block_size=pick([8, 32, 16384]),
        epochs=pick([1, 1, 2]),
        map=rng.random() < 0.4,
        filter=rng.random() < 0.3,
        tokenize=tokenize,
        pack=pack,
        seq_len=pick([4, 16, 32]),
        buffer_size=pick([1, 4]),
        batch=batch,
        drop_last=drop_last,
        continuous=continuous,
        errors=errors,
        loader=loader,
        ranks=ranks,
        resume=resume,
        at=rng.random(),
        ranks_after=ranks_after,
        loader_after=loader_after,
    )
