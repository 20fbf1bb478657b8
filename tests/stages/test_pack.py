"""Tokenize and pack: invariants over random documents, and exact resumption mid-document."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from makers import EOS, word_tokenizer, write_docs
from tokenizers import Tokenizer, models, pre_tokenizers

import tidal
from tidal.stages.pack import IGNORE, cu_seqlens
from tidal.testing import assert_resumes_exactly


def stream_of(ds: tidal.Dataset) -> list[int]:
    """The token stream the packer sees: the tokenized documents in order, EOS after each."""
    return [t for r in ds for t in r["input_ids"].tolist()]


docs_st = st.lists(st.lists(st.integers(0, EOS - 1), min_size=0, max_size=40), min_size=1, max_size=30)
fast = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@fast
@given(docs=docs_st, seq_len=st.integers(1, 24), shift=st.booleans(), mask=st.booleans())
def test_concat_keeps_every_token_in_order_but_the_last_remainder(tmp_path_factory, docs, seq_len, shift, mask) -> None:
    root = write_docs(tmp_path_factory.mktemp("d") / "data", docs)
    tokens = tidal.Dataset(root).tokenize(word_tokenizer(), eos="<eos>")
    stream = stream_of(tokens)
    seqs = list(tokens.pack(seq_len, shift_labels=shift, mask_boundaries=mask))
    need = seq_len + shift
    assert len(seqs) == (max(0, (len(stream) - shift) // seq_len) if len(stream) >= need else 0)
    flat = [t for s in seqs for t in s["input_ids"].tolist()]
    assert flat == stream[: len(flat)]
    assert len(stream) - len(flat) < need  # only the remainder is dropped
    for k, s in enumerate(seqs):
        check_sequence(s, stream, k * seq_len, shift, mask)


def check_sequence(s: dict, stream: list[int], at: int, shift: bool, mask: bool) -> None:
    ids, labels, pos, seg = s["input_ids"], s["labels"], s["position_ids"], s["segment_ids"]
    L = len(ids)
    doc_start = {0} | {i + 1 for i, t in enumerate(stream) if t == EOS}
    for i in range(L):
        g = at + i
        assert pos[i] == (0 if i == 0 or g in doc_start else pos[i - 1] + 1)
        assert seg[i] == (1 if i == 0 else seg[i - 1] + (pos[i] == 0))
        if shift:
            crossing = g + 1 in doc_start
            assert labels[i] == (IGNORE if mask and crossing else stream[g + 1])
        else:
            crossing = i > 0 and g in doc_start
            assert labels[i] == (IGNORE if mask and crossing else stream[g])


@fast
@given(docs=docs_st, seq_len=st.integers(2, 24), shift=st.booleans(), buffer=st.integers(1, 4))
def test_best_fit_cuts_only_long_documents_and_loses_nothing(tmp_path_factory, docs, seq_len, shift, buffer) -> None:
    root = write_docs(tmp_path_factory.mktemp("d") / "data", docs)
    tokens = tidal.Dataset(root).tokenize(word_tokenizer(), eos="<eos>")
    documents = [r["input_ids"].tolist() for r in tokens]
    it = tokens.pack(seq_len, "best_fit", shift_labels=shift, buffer_size=buffer).iterator()
    seqs = list(it)
    pieces = []
    for s in seqs:
        ids, labels, pos, seg = (s[k].tolist() for k in ("input_ids", "labels", "position_ids", "segment_ids"))
        used = sum(1 for x in seg if x > 0)
        assert seg[used:] == [0] * (len(seg) - used) and labels[used:] == [IGNORE] * (len(seg) - used)
        for k in range(1, max(seg, default=0) + 1):
            span = [i for i, x in enumerate(seg) if x == k]
            assert span == list(range(span[0], span[-1] + 1)) and [pos[i] for i in span] == list(range(len(span)))
            piece = [ids[i] for i in span]
            pieces.append(piece)
            if shift:
                assert [labels[i] for i in span[:-1]] == piece[1:]
            else:
                assert labels[span[0]] == IGNORE and [labels[i] for i in span[1:]] == piece[1:]
    # every document is one piece, or (when longer than seq_len) pieces of seq_len and a remainder
    expected = sorted(d[a : a + seq_len] for d in documents for a in range(0, len(d), seq_len))
    assert sorted(pieces) == expected
    padding = sum(seq_len - sum(1 for x in s["segment_ids"] if x > 0) for s in seqs)
    assert it.stats()["padding"] == pytest.approx(padding / (len(seqs) * seq_len) if seqs else 0.0)


def docs_dataset(tmp_path: Path) -> tidal.Dataset:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, EOS, rng.integers(1, 60)).tolist() for _ in range(80)]
    return tidal.Dataset(write_docs(tmp_path / "data", docs, shards=4)).shuffle(seed=1, block_size=16)


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_pack_resumes_exactly_mid_document(tmp_path: Path, strategy: str) -> None:
    ds = docs_dataset(tmp_path).repeat(2).tokenize(word_tokenizer(), eos="<eos>").pack(16, strategy, buffer_size=3)
    assert assert_resumes_exactly(ds, horizon=5) > 150
    assert assert_resumes_exactly(ds.batch(3), horizon=None) > 50


def test_packed_batches_resume_through_the_loader(tmp_path: Path) -> None:
    import itertools

    ds = docs_dataset(tmp_path).repeat().tokenize(word_tokenizer(), eos="<eos>").pack(32).batch(4)
    full = list(itertools.islice(tidal.DataLoader(ds, num_workers=2), 40))
    loader = tidal.DataLoader(ds, num_workers=2)
    head = list(itertools.islice(loader, 13))
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = tidal.DataLoader(ds, num_workers=2)
    resumed.load_state_dict(state)
    rest = list(itertools.islice(resumed, 27))
    for a, b in zip(head + rest, full, strict=True):
        assert a["input_ids"].dtype.is_floating_point is False and a["input_ids"].dtype == b["input_ids"].dtype
        assert all((a[k] == b[k]).all() for k in ("input_ids", "labels", "position_ids", "segment_ids"))


def test_tokenize_accepts_a_path_and_finds_eos(tmp_path: Path) -> None:
    tok = word_tokenizer()
    vocab = tok.get_vocab() | {"<|endoftext|>": EOS + 1}
    tok2 = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok2.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok2.save(str(tmp_path / "tokenizer.json"))
    ds = tidal.Dataset(write_docs(tmp_path / "data", [[5, 6, 7]], shards=1))
    assert next(iter(ds.tokenize(tmp_path / "tokenizer.json")))["input_ids"].tolist() == [5, 6, 7, EOS + 1]
    assert next(iter(ds.tokenize(tmp_path, eos=False)))["input_ids"].tolist() == [5, 6, 7]
    assert next(iter(ds.tokenize(tok, max_length=2, eos=3)))["input_ids"].tolist() == [5, 3]
    assert next(iter(ds.tokenize(tok)))["input_ids"].tolist() == [5, 6, 7, EOS]  # "<eos>" is a known name
    with pytest.raises(tidal.TidalError, match="end-of-document token"):
        ds.tokenize(Tokenizer(models.WordLevel({str(i): i for i in range(10)}, unk_token="0")))
    with pytest.raises(tidal.SchemaError, match="none of the 1 records it was given has a column 'body'"):
        list(ds.tokenize(tok, column="body", eos=False))
    with pytest.raises(tidal.TidalError, match="tokenize\\(\\) text first"):  # text is not token ids
        next(iter(ds.pack(4)))


def test_cu_seqlens_marks_every_document_start() -> None:
    position_ids = np.array([[0, 1, 2, 0, 1], [0, 1, 0, 0, 1]])
    assert cu_seqlens(position_ids).tolist() == [0, 3, 5, 7, 8, 10]


def _rayon_threads(record: dict) -> dict:
    import os

    return {**record, "rayon": os.environ.get("RAYON_NUM_THREADS", "unset")}


def test_tokenizer_threads_are_shared_among_dataloader_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import torch  # noqa: F401  (tidal.DataLoader)

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tidal.Dataset(write_docs(tmp_path / "data", [[1, 2, 3]] * 20)).tokenize(word_tokenizer(), eos="<eos>")
    seen = {r["rayon"] for r in tidal.DataLoader(ds.map(_rayon_threads), num_workers=2)}
    cores = len(os.sched_getaffinity(0))
    assert seen == {str(max(1, cores // 2))}  # 2 workers x their threads: no more than the cores
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")  # the user's choice is kept
    assert {r["rayon"] for r in tidal.DataLoader(ds.map(_rayon_threads), num_workers=2)} == {"3"}
