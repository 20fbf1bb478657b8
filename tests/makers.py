"""Data and tokenizers that tests in several folders make: word documents and their tokenizer,
records of numbers, a trained BPE tokenizer, Megatron indexed datasets, CSV bytes.

(conftest.py holds the makers of plain shards: write_jsonl, write_parquet, make_shards.)
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

EOS = 1000


def word_tokenizer() -> Tokenizer:
    """Token k is the word "k": documents of numbers encode to exactly those numbers."""
    vocab = {str(i): i for i in range(EOS)} | {"<eos>": EOS}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def write_docs(root: Path, docs: list[list[int]], shards: int = 3) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        lines = [json.dumps({"text": " ".join(map(str, d))}) for d in docs[s::shards]]
        (root / f"docs-{s}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def write_records(root: Path, shards: int = 3, per_shard: int = 40, offset: int = 0) -> Path:
    """Records ``{"id", "text"}``: the text is numbers, so the word tokenizer encodes it to them."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(offset)
    for s in range(shards):
        lines = []
        for i in range(per_shard):
            words = rng.integers(0, EOS, rng.integers(1, 40)).tolist()
            lines.append(json.dumps({"id": offset + s * 1000 + i, "text": " ".join(map(str, words))}))
        (root / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def train_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    tok.train_from_iterator([f"record {i} of shard {i % 3}" for i in range(500)], trainer)
    tok.save(str(path))


CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def write_megatron(prefix: Path, documents: list[list[np.ndarray]], dtype: type = np.uint16) -> Path:
    """``prefix.bin`` and ``prefix.idx``: each document a list of sequences, as Megatron's builder writes them."""
    seqs = [s.astype(dtype) for doc in documents for s in doc]
    lengths = np.array([len(s) for s in seqs], dtype="<i4")
    ends = np.cumsum(lengths.astype(np.int64) * np.dtype(dtype).itemsize)
    pointers = np.concatenate([[0], ends])[: len(seqs)].astype("<i8")  # one per sequence: none for an empty file
    doc_index = np.concatenate([[0], np.cumsum([len(d) for d in documents])]).astype("<i8")
    prefix.with_suffix(".bin").write_bytes(b"".join(s.tobytes() for s in seqs))
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, CODES[np.dtype(dtype)], len(seqs), len(doc_index))
    prefix.with_suffix(".idx").write_bytes(head + lengths.tobytes() + pointers.tobytes() + doc_index.tobytes())
    return prefix.with_suffix(".bin")


def corpus(n_docs: int, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(0, 50_000, int(rng.integers(1, 30))) for _ in range(int(rng.integers(1, 4)))]
        for _ in range(n_docs)
    ]


ROWS = [{"id": i, "name": f"name {i}", "score": i / 4} for i in range(50)]


def csv_bytes(rows: list[dict], sep: str = ",") -> bytes:
    lines = [sep.join(rows[0])] + [sep.join(str(v) for v in r.values()) for r in rows]
    return ("\n".join(lines) + "\n").encode()
