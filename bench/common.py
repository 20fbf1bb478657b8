"""What the benchmark scripts share: logging, the corpus's records, the tokenizer they train, and
the state a resume measurement saves. Each script runs as ``python bench/NAME.py`` (its
directory first on ``sys.path``), so they import this as ``common``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

EOS = "<|endoftext|>"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def load_json(path: Path) -> dict[str, Any]:
    """A manifest, or ``{}`` when there is none (or it is damaged): then everything is rebuilt."""
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads(path.read_text()))
    return {}


def read_jsonl(path: str) -> Iterator[dict[str, Any]]:
    """The records of one corpus file. Top level: LitData's spawned workers import it by name."""
    with open(path, "rb") as f:
        for line in f:
            rec = json.loads(line)
            yield {"id": rec["id"], "text": rec["text"]}


def corpus_texts(files: list[str] | list[Path], limit: int) -> Iterator[str]:
    """The ``text`` of each record of ``files`` in order, up to ``limit`` characters in all (the corpus is ASCII)."""
    n = 0
    for path in files:
        for rec in read_jsonl(str(path)):
            if n >= limit:
                return
            n += len(rec["text"])
            yield rec["text"]


def train_tokenizer(files: list[str] | list[Path], out: Path, vocab: int, limit: int) -> None:
    """A byte-level BPE tokenizer with one special token, EOS, trained on the first ``limit`` characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_texts(files, limit), trainer)
    tok.save(str(out))


def resume_points(
    loader: Any,
    records: int,
    batch: int,
    fractions: list[float],
    ids: Callable[[Any], list[int]],
    dumps: Callable[[Any], Any],
) -> tuple[dict[str, Any], Iterator[Any]]:
    """Consume each fraction of an epoch of ``records``, and at each save the loader's
    ``state_dict()`` and the ids of the batch that follows: what a resumed loader must yield
    first; ``dumps`` is how the state is saved (its size is reported). Returns the points by
    fraction and the iterator, still open."""
    targets = sorted((max(1, math.ceil(f * records / batch)), f) for f in fractions)
    saved: dict[str, Any] = {}
    t0 = time.perf_counter()
    it = iter(loader)
    step = 0
    for target, fraction in targets:
        while step < target:
            next(it)
            step += 1
        state = loader.state_dict()
        following = next(it)
        step += 1
        saved[str(fraction)] = {
            "state": state,
            "expected_ids": ids(following),
            "consumed_records": target * batch,
            "state_bytes": len(dumps(state)),
            "reached_after_s": time.perf_counter() - t0,
        }
    return saved, it


def batch_ids(batch: dict[str, Any]) -> list[int]:
    """The ``id`` column of a batch, as Python ints, whatever the loader made of it."""
    ids = batch["id"]
    return [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
