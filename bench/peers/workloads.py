"""What a child process measures, one function per kind of ``Spec``: a stream of text or token batches, the raw
tokenizer, the page cache, and the two halves of a resume (saving the states, loading one). Each returns its
figures; ``_keep`` holds what must stay alive until they are printed."""

from __future__ import annotations

import math
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import batch_ids, corpus_texts, resume_points

from peers import COPIES, PEERS, TIDAL
from peers.base import forever
from peers.harness import serve, steady
from peers.spec import Spec
from peers.tidal import JSONL


def _rows(batch: Any) -> int:
    ids = batch["input_ids"] if isinstance(batch, dict) else batch
    return int(ids.shape[0])


def stream(spec: Spec) -> dict[str, Any]:
    """text or tokens: the first batch, then ``seconds`` of steady state."""
    t0 = time.perf_counter()
    tokens = spec.kind == "tokens"
    peer = PEERS[spec.loader]
    loader = peer.tokens(spec) if tokens else peer.loader(spec)
    t1 = time.perf_counter()
    it = forever(loader, spec.loader in TIDAL)
    next(it)
    t2 = time.perf_counter()
    first_wall = time.time()
    marks = [(first_wall, 0)] if spec.url else None  # from S3: when each record came, for bench_shaped.py
    if tokens:
        n, elapsed = steady(it, spec.seconds, lambda b: _rows(b) * spec.seq_len, marks)
    else:
        n, elapsed = steady(it, spec.seconds, lambda b: len(b["id"]), marks)
    out: dict[str, Any] = {
        "units": n,
        "seconds": elapsed,
        "rate": n / elapsed if elapsed > 0 else math.nan,
        "setup_s": t1 - t0,
        "first_batch_from_iter_s": t2 - t1,
        "first_batch_from_start_s": first_wall - spec.t_spawn,
    }
    if marks is not None:
        out["timeline"] = marks
    return {**out, "_keep": it}


def raw(spec: Spec) -> dict[str, Any]:
    """Raw ``encode_batch`` (or ``encode_batch_fast``, no offsets: what tidal calls) on texts already in memory,
    256 at a time, for ``seconds``: the tokenizer's limit."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(spec.tokenizer)
    encode = getattr(tok, spec.method)
    texts = list(corpus_texts(JSONL.files(spec.root), int(spec.raw_mb * 1e6)))
    tokens = docs = 0
    t0 = now = time.perf_counter()
    while now - t0 < spec.seconds:
        for i in range(0, len(texts), 256):
            chunk = texts[i : i + 256]
            tokens += sum(len(e.ids) for e in encode(chunk, add_special_tokens=False)) + len(chunk)
            docs += len(chunk)
            now = time.perf_counter()
            if now - t0 >= spec.seconds:
                break
    return {"units": tokens, "docs": docs, "seconds": now - t0, "rate": tokens / (now - t0)}


def cache(spec: Spec) -> dict[str, Any]:
    """Every format's data files read whole twice; the second pass, from the page cache, is timed."""
    buf = bytearray(8 << 20)
    out: dict[str, Any] = {}
    for fmt, copy in COPIES.items():
        files = copy.files(os.path.join(spec.root, fmt))
        if not files:
            continue
        for _ in range(2):
            nbytes = 0
            t0 = time.perf_counter()
            for f in files:
                with open(f, "rb", buffering=0) as fh:
                    while n := fh.readinto(buf):
                        nbytes += n
            seconds = time.perf_counter() - t0
        out[fmt] = {"bytes": nbytes, "seconds": seconds, "gb_per_s": nbytes / seconds / 1e9}
    return out


def resume_save(spec: Spec) -> dict[str, Any]:
    """Consume each fraction of an epoch, save the loader's ``state_dict()`` and the ids of the batch that follows."""
    loader = PEERS[spec.loader].loader(spec)
    saved, it = resume_points(loader, spec.records, spec.batch, spec.fractions, batch_ids, pickle.dumps)
    Path(spec.state_file).write_bytes(pickle.dumps(saved))
    return {"points": {k: {**v, "state": None} for k, v in saved.items()}, "_keep": it}


def resume_load(spec: Spec) -> dict[str, Any]:
    """A new loader in a new process: ``load_state_dict``, then the first batch, timed and checked."""
    loader = PEERS[spec.loader].loader(spec)
    point = pickle.loads(Path(spec.state_file).read_bytes())[str(spec.at)]
    t0 = time.perf_counter()
    loader.load_state_dict(point["state"])
    it = iter(loader)
    first = next(it)
    t1 = time.perf_counter()
    wall = time.time()
    return {
        "first_batch_after_load_s": t1 - t0,
        "first_batch_from_start_s": wall - spec.t_spawn,
        "exact": batch_ids(first) == point["expected_ids"],
        "consumed_records": point["consumed_records"],
        "state_bytes": point["state_bytes"],
        "_keep": it,
    }


MEASURES: dict[str, Callable[[Spec], dict[str, Any]]] = {
    "text": stream,
    "tokens": stream,
    "raw": raw,
    "cache": cache,
    "resume-save": resume_save,
    "resume-load": resume_load,
}


def child(spec_json: str) -> None:
    """The child's side of ``bench_peers.py --child SPEC``: measure, print the figures, leave."""
    serve(spec_json, MEASURES)
