"""Tokenization: a text column into compact numpy arrays of token ids, many documents per call.

Documents are encoded with ``encode_batch_fast`` of Hugging Face ``tokenizers`` (its Rust
thread pool; no offsets computed), so the cost per document is the tokenizer's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tidal import env
from tidal.errors import ArgumentError, ConfigError, FormatError, SourceError, needs
from tidal.stages import Context, Needed, OneToOne, StageIterator, Stateless, add_stats
from tidal.stages.locators import Kept, Locator
from tidal.state.view import View
from tidal.tables import Table, records

_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>", "[SEP]")


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer and what tidal needs of it: how to encode, the EOS id, the id dtype."""

    backend: Any  # tokenizers.Tokenizer, or a transformers tokenizer without a fast backend
    eos_id: int | None
    dtype: np.dtype
    path: str | None = field(default=None, compare=False)  # as given, when it was loaded from a path

    def to_config(self) -> str | dict:
        """The path it was loaded from, else its ``tokenizer.json`` as a string: ``{"json": ...}``."""
        if self.path is not None:
            return self.path
        if hasattr(self.backend, "to_str"):
            return {"json": self.backend.to_str()}
        raise ConfigError(
            f"a {type(self.backend).__name__} without a fast (tokenizers) backend cannot be written in a "
            "config: pass tokenize() the path of its tokenizer.json"
        )

    def encode(self, texts: list[str]) -> list[list[int]]:
        if hasattr(self.backend, "encode_batch_fast"):
            return [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)]
        return self.backend(texts, add_special_tokens=False)["input_ids"]


def load(tokenizer: Any, eos: bool | int | str = True) -> Tokenizer:
    """Accept a path to ``tokenizer.json``, a ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer."""
    hf_eos: int | None = None
    given = os.fspath(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else None
    if isinstance(tokenizer, dict) and set(tokenizer) == {"json"}:  # as to_config() writes one
        rust = needs("tokenizers", "tokenize()", "tokenize").Tokenizer
        try:
            tokenizer = rust.from_str(tokenizer["json"])
        except Exception as exc:  # tokenizers raises a bare Exception for what it cannot parse
            raise ConfigError(f"tokenize: the tokenizer's json is not one tokenizers reads: {exc}") from None
    if isinstance(tokenizer, (str, os.PathLike)):
        rust = needs("tokenizers", "tokenize()", "tokenize").Tokenizer
        path = os.fspath(tokenizer)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise SourceError(f"{tokenizer}: no tokenizer.json there")
        try:
            backend = rust.from_file(path)
        except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot parse
            raise FormatError(f"{path}: not a tokenizer.json that tokenizers reads: {exc}") from None
    elif hasattr(tokenizer, "encode_batch_fast") or hasattr(tokenizer, "encode_batch"):
        backend = tokenizer
    elif hasattr(tokenizer, "backend_tokenizer") or callable(tokenizer):
        hf_eos = getattr(tokenizer, "eos_token_id", None)
        backend = getattr(tokenizer, "backend_tokenizer", None) or tokenizer
    else:
        raise ArgumentError(f"not a tokenizer: {type(tokenizer).__name__}")
    vocab = backend.get_vocab_size() if hasattr(backend, "get_vocab_size") else len(backend)
    dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)
    return Tokenizer(backend, _eos_id(backend, eos, hf_eos), dtype, given)


def _fields(rec: Any) -> str:
    return ", ".join(sorted(rec)) if isinstance(rec, dict) else f"a {type(rec).__name__}, not a dict"


def _eos_id(backend: Any, eos: bool | int | str, hf_eos: int | None) -> int | None:
    if eos is False:
        return None
    if isinstance(eos, int) and not isinstance(eos, bool):
        return eos
    if isinstance(eos, str):
        token = backend.token_to_id(eos) if hasattr(backend, "token_to_id") else backend.convert_tokens_to_ids(eos)
        if token is None:
            raise ArgumentError(f"the tokenizer has no token {eos!r} to use as EOS")
        return int(token)
    if hf_eos is not None:
        return int(hf_eos)
    for candidate in _EOS_CANDIDATES:
        token = backend.token_to_id(candidate) if hasattr(backend, "token_to_id") else None
        if token is not None:
            return int(token)
    raise ArgumentError(
        "cannot tell this tokenizer's end-of-document token: pass eos='<token>' or eos=<id>, or eos=False for none"
    )


@dataclass(frozen=True, repr=False)
class Tokenize(OneToOne):
    METHOD = "tokenize"
    EXTRA = (("eos", "column"),)  # tokenize(..., eos=): the tokenizer's EOS id, after column

    tokenizer: Tokenizer
    column: str = "text"
    max_length: int | None = None

    def tokenizer_used(self) -> Tokenizer:
        return self.tokenizer

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        env.share_tokenizer_threads(ctx.world.num_workers)
        return TokenizeIterator(self.upstream.open(ctx, position), self.tokenizer, self.column, self.max_length)

    def facts(self) -> list:
        return [self.column, self.tokenizer.eos_id, str(self.tokenizer.dtype), self.max_length]

    def config_args(self) -> dict[str, Any]:
        t = self.tokenizer
        args = {"tokenizer": t.to_config(), "column": self.column, "eos": t.eos_id if t.eos_id is not None else False}
        if self.max_length is not None:
            args["max_length"] = self.max_length
        return args

    def call(self) -> str:
        backend = type(self.tokenizer.backend).__name__
        return f"tokenize({backend}, column={self.column!r}, eos={self.tokenizer.eos_id}, max_length={self.max_length})"


class TokenizeIterator(Stateless):
    """Replaces ``column`` (a string) by ``input_ids`` (a numpy array) in every record."""

    def __init__(self, upstream: StageIterator, tokenizer: Tokenizer, column: str, max_length: int | None):
        super().__init__(upstream)
        self._tok, self._column, self._max_length = tokenizer, column, max_length
        self.exact = upstream.exact  # one document per upstream record
        self.documents = 0
        self.tokens = 0
        self._needed = Needed(column, "tokenize", "pass tokenize(column=...) the column of the text")
        self._kept: list[int] | None = None  # the upstream items the last table holds; None: all

    def next(self, max_items: int) -> Table:
        while True:  # StopIteration from upstream ends this stage too
            try:
                table = self._up.next(max_items)
            except StopIteration:
                self._needed.ended()
                raise
            out = self._tokenize(records(table), max_items)
            if out:
                return out

    def _tokenize(self, recs: list[Any], size: int) -> list[Any]:
        column = self._column
        self._kept = None
        try:
            texts = [r[column] for r in recs]
        except (KeyError, TypeError, IndexError):
            texts = [r.get(column) if isinstance(r, dict) else None for r in recs]
        if not all(isinstance(t, str) for t in texts):
            self._needed.check(recs)
            has = [isinstance(r, dict) and column in r for r in recs]
            locator = self._up.locate()
            for i, text in enumerate(texts):  # a record without text is bad data: the errors policy's
                if not isinstance(text, str):
                    found = type(text).__name__ if has[i] else f"no such field (fields: {_fields(recs[i])})"
                    why = f"tokenize: column {column!r} must hold a string, found {found}"
                    self._needed.reject(locator, i, why, self._up, size)
            self._kept = [i for i, t in enumerate(texts) if isinstance(t, str)]
            recs, texts = [recs[i] for i in self._kept], [texts[i] for i in self._kept]
        else:
            self._needed.seen = True
        eos, dtype, cap = self._tok.eos_id, self._tok.dtype, self._max_length
        out = []
        for rec, ids in zip(recs, self._tok.encode(texts), strict=True):
            if cap is not None:
                ids = ids[: cap - (eos is not None)]
            if eos is not None:
                ids.append(eos)
            arr = np.array(ids, dtype=dtype)
            self.tokens += len(arr)
            out.append({**{k: v for k, v in rec.items() if k != column}, "input_ids": arr})
        self.documents += len(out)
        return out

    def locate(self) -> Locator:
        up = self._up.locate()
        return up if self._kept is None else Kept(up, self._kept)

    def stats(self) -> dict:
        return add_stats(self._up.stats(), {"documents": self.documents, "tokens": self.tokens})
