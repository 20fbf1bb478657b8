"""tidal.trace: every segment it names is read back from its file, and the rows rebuilt from
the segments are the rows the training loop saw (ids of plain rows, token ids of packed
rows), with 0 and 2 workers, after a resume and after an elastic resume."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from makers import EOS, word_tokenizer, write_records

import tidal
from tidal.provenance import Replay


def read_back(segment: dict) -> dict:
    """The record a segment names, read from its file by the format's own reader (JSON lines, Parquet)."""
    path = Path(segment["file"])
    if path.suffix == ".parquet":
        return pq.read_table(path).slice(segment["row"], 1).to_pylist()[0]
    return json.loads(path.read_text().splitlines()[segment["row"]])


def tokens_of(record: dict) -> list[int]:
    """What tokenize(word_tokenizer(), eos="<eos>") makes of a record."""
    return [int(w) for w in record["text"].split()] + [EOS]


def rebuild_ids(batch: list[list[dict]]) -> list[int]:
    assert all(len(row) == 1 and row[0]["start"] is None and row[0]["end"] is None for row in batch)
    return [read_back(row[0])["id"] for row in batch]


def rebuild_tokens(batch: list[list[dict]]) -> list[list[int]]:
    rows = []
    for row in batch:
        tokens: list[int] = []
        for seg in row:
            assert 0 <= seg["start"] < seg["end"]
            tokens += tokens_of(read_back(seg))[seg["start"] : seg["end"]]
        rows.append(tokens)
    return rows


def ids(batch: Any) -> list[int]:
    return [int(x) for x in batch["id"]]


def token_rows(batch: Any) -> list[list[int]]:
    return [[int(x) for x in row] for row in batch["input_ids"]]


def unpadded(batch: Any) -> list[list[int]]:
    """Each row's tokens but best-fit padding (segment id 0, after the documents' pieces)."""
    rows = []
    for row, segments in zip(token_rows(batch), batch["segment_ids"].tolist(), strict=True):
        n = sum(1 for s in segments if s > 0)
        assert all(s == 0 for s in segments[n:])
        rows.append(row[:n])
    return rows


def resumed(ds: tidal.Dataset, state: dict, workers: int, n: int) -> list[Any]:
    loader = tidal.DataLoader(ds, num_workers=workers)
    loader.load_state_dict(state)
    return list(itertools.islice(loader, n))


def saved_after(ds: tidal.Dataset, workers: int, n: int) -> dict:
    loader = tidal.DataLoader(ds, num_workers=workers)
    for _ in itertools.islice(loader, n):
        pass
    return json.loads(json.dumps(loader.state_dict()))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_records(tmp_path / "web")


def keep_even(r: dict) -> bool:
    return r["id"] % 2 == 0


def add_one(r: dict) -> dict:
    return {**r, "id": r["id"] + 0}


@pytest.mark.parametrize("workers", [0, 2])
def test_plain_rows_are_read_back_after_a_resume(data: Path, workers: int) -> None:
    ds = tidal.Dataset(data).shuffle(seed=3, block_size=32).map(add_one).filter(keep_even).batch(4)
    state = saved_after(ds, workers, 3)
    seen = resumed(ds, state, workers, 6)
    traced = tidal.trace(ds, state, steps=6)
    assert len(traced) == len(seen) == 6
    assert [rebuild_ids(b) for b in traced] == [ids(b) for b in seen]


@pytest.mark.parametrize(("saved_on", "restored_on"), [(2, 0), (0, 2)])
def test_plain_rows_after_an_elastic_resume(data: Path, saved_on: int, restored_on: int) -> None:
    ds = tidal.Dataset(data).shuffle(seed=3, block_size=32).batch(5)
    state = saved_after(ds, saved_on, 4)
    seen = resumed(ds, state, restored_on, 8)
    traced = tidal.trace(ds, state, steps=8, num_workers=restored_on)
    assert [rebuild_ids(b) for b in traced] == [ids(b) for b in seen]


def packed(data: Path, strategy: str) -> tidal.Dataset:
    return (
        tidal.Dataset(data)
        .shuffle(seed=1, block_size=16)
        .repeat()
        .tokenize(word_tokenizer(), eos="<eos>")
        .pack(24, strategy, buffer_size=3)
        .batch(3)
    )


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
@pytest.mark.parametrize("workers", [0, 2])
def test_packed_rows_are_token_ranges_of_their_documents(data: Path, strategy: str, workers: int) -> None:
    ds = packed(data, strategy)
    state = saved_after(ds, workers, 5)
    seen = resumed(ds, state, workers, 10)
    traced = tidal.trace(ds, state, steps=10)
    assert [rebuild_tokens(b) for b in traced] == [unpadded(b) for b in seen]
    assert any(len(row) > 1 for b in traced for row in b)  # rows holding pieces of several documents


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_packed_rows_after_an_elastic_resume(data: Path, strategy: str) -> None:
    ds = packed(data, strategy)
    state = saved_after(ds, 2, 5)
    seen = resumed(ds, state, 0, 6)
    traced = tidal.trace(ds, state, steps=6, num_workers=0)
    assert [rebuild_tokens(b) for b in traced] == [unpadded(b) for b in seen]


@pytest.mark.parametrize("workers", [0, 2])
def test_continuous_rows_follow_their_lanes(data: Path, workers: int) -> None:
    ds = (
        tidal.Dataset(data)
        .shuffle(seed=0, block_size=32)
        .repeat()
        .tokenize(word_tokenizer(), eos="<eos>")
        .pack(16)
        .batch(4, continuous=True)
    )
    state = saved_after(ds, workers, 3)
    seen = resumed(ds, state, workers, 5)
    traced = tidal.trace(ds, state, steps=5)
    assert [rebuild_tokens(b) for b in traced] == [token_rows(b) for b in seen]


def test_mixed_streams_name_their_stream(tmp_path: Path) -> None:
    web = tidal.Dataset(write_records(tmp_path / "web", offset=0)).shuffle(seed=0).repeat()
    code = tidal.Dataset(write_records(tmp_path / "code", shards=2, offset=50_000)).repeat()
    ds = tidal.mix({"web": web, "code": code}, weights={"web": 0.6, "code": 0.4}, seed=2).batch(6)
    state = saved_after(ds, 2, 3)
    seen = resumed(ds, state, 2, 6)
    traced = tidal.trace(ds, state, steps=6)
    assert [rebuild_ids(b) for b in traced] == [ids(b) for b in seen]
    streams = {seg["stream"] for b in traced for row in b for seg in row}
    assert streams == {"web", "code"}
    for b in traced:
        for row in b:
            assert (row[0]["stream"] == "code") == ("/code/" in row[0]["file"])


def test_parquet_rows_are_read_back(tmp_path: Path) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    for s in range(3):
        pq.write_table(
            pa.table({"id": list(range(s * 100, s * 100 + 30)), "text": ["1 2 3"] * 30}),
            root / f"p{s}.parquet",
            row_group_size=7,
        )
    ds = tidal.Dataset(root).shuffle(seed=5, block_size=20).batch(4)
    state = saved_after(ds, 0, 2)
    seen = resumed(ds, state, 0, 5)
    assert [rebuild_ids(b) for b in tidal.trace(ds, state, steps=5)] == [ids(b) for b in seen]


def test_skip_starts_later_and_a_trace_ends_with_the_pass(data: Path) -> None:
    ds = tidal.Dataset(data).batch(10)  # 120 records: 12 batches
    state = saved_after(ds, 2, 2)
    whole = tidal.trace(ds, state, steps=100)
    assert len(whole) == 10
    assert tidal.trace(ds, state, steps=3, skip=4) == whole[4:7]
    steps = [s.step for s in Replay(ds, state)]
    assert steps == list(range(2, 12))


def test_a_state_of_another_dataset_or_rank_is_refused(data: Path, tmp_path: Path) -> None:
    ds = tidal.Dataset(data).batch(4)
    state = saved_after(ds, 0, 2)
    other = tidal.Dataset(write_records(tmp_path / "other", shards=2)).batch(4)
    with pytest.raises(tidal.StateError):
        tidal.trace(other, state, steps=1)
    with pytest.raises(tidal.StateError):
        tidal.trace(ds, {**state, "ranks": None}, steps=1)
    hostile = json.loads(json.dumps(state))
    hostile["ranks"][0]["workers"][0]["position"]["offset"] = 10**9
    with pytest.raises(tidal.StateError, match="offset"):
        tidal.trace(ds, hostile, steps=1)
    with pytest.raises(tidal.ArgumentError):
        tidal.trace(ds, state, steps=1, rank=1)
    with pytest.raises(tidal.ArgumentError):
        tidal.trace(ds, state, steps=-1)


def test_tracing_leaves_the_chain_as_it_was(data: Path) -> None:
    ds = packed(data, "concat")
    before = ds.fingerprint()
    state = saved_after(ds, 0, 1)
    tidal.trace(ds, state, steps=2)
    assert pickle.loads(pickle.dumps(ds)).fingerprint() == before == ds.fingerprint()


def write_format(root: Path, kind: str) -> None:
    """Three shards of records ``{"id"}`` in ``kind``, ids ``1000 * shard + row``."""
    import csv
    import gzip
    import io
    import tarfile

    import pyarrow.ipc

    root.mkdir(parents=True)
    for s in range(3):
        ids = [1000 * s + i for i in range(11 + 3 * s)]
        if kind == "csv":
            with open(root / f"p{s}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["id", "text"])
                writer.writerows([i, f"t{i}"] for i in ids)
        elif kind == "arrow":
            table = pa.table({"id": ids})
            with pa.OSFile(str(root / f"p{s}.arrow"), "wb") as sink, pyarrow.ipc.new_file(sink, table.schema) as w:
                w.write_table(table, max_chunksize=4)
        elif kind == "jsonl.gz":
            (root / f"p{s}.jsonl.gz").write_bytes(
                gzip.compress("".join(json.dumps({"id": i}) + "\n" for i in ids).encode())
            )
        elif kind == "tar":
            with tarfile.open(root / f"p{s}.tar", "w") as tf:
                for i in ids:
                    payload = json.dumps({"id": i}).encode()
                    info = tarfile.TarInfo(f"k{i:05d}.json")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))


def read_format(segment: dict) -> int:
    """The id of the record a segment names, read with the format's own reader."""
    import csv
    import gzip
    import tarfile

    import pyarrow.ipc

    path, row = Path(segment["file"]), segment["row"]
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            return int(list(csv.DictReader(f))[row]["id"])
    if path.suffix == ".arrow":
        with pa.memory_map(str(path)) as source:
            return pyarrow.ipc.open_file(source).read_all().column("id")[row].as_py()
    if path.suffix == ".gz":
        return json.loads(gzip.decompress(path.read_bytes()).decode().splitlines()[row])["id"]
    with tarfile.open(path) as tf:
        member = tf.getmembers()[row]
        file = tf.extractfile(member)
        assert file is not None
        return json.loads(file.read())["id"]


@pytest.mark.parametrize("kind", ["csv", "arrow", "jsonl.gz", "tar"])
def test_every_format_names_its_rows(tmp_path: Path, kind: str) -> None:
    write_format(tmp_path / kind, kind)
    ds = tidal.Dataset(tmp_path / kind).shuffle(seed=7, block_size=8).batch(3)
    state = saved_after(ds, 2, 2)
    seen = resumed(ds, state, 2, 6)
    traced = tidal.trace(ds, state, steps=6)

    def record_id(batch: Any) -> list[int]:
        if kind == "tar":
            return [int(r["id"]) for r in batch["json"]]
        return ids(batch)

    assert [[read_format(row[0]) for row in b] for b in traced] == [record_id(b) for b in seen]


def test_token_shards_pack_by_token_ranges(tmp_path: Path) -> None:
    from tidal.convert import convert

    convert(
        str(write_records(tmp_path / "web")),
        str(tmp_path / "tokens"),
        to="tokens",
        tokenizer=word_tokenizer(),
        column="text",
        shard_size="2kB",
    )
    ds = tidal.Dataset(tmp_path / "tokens").shuffle(seed=2, block_size=16).pack(20).batch(2)
    state = saved_after(ds, 2, 3)
    seen = resumed(ds, state, 2, 5)
    traced = tidal.trace(ds, state, steps=5)
    files: dict[str, list[list[int]]] = {}
    rebuilt = []
    for b in traced:
        rows = []
        for row in b:
            tokens: list[int] = []
            for seg in row:
                if seg["file"] not in files:  # the shard read alone, in order, by its own reader
                    files[seg["file"]] = [r["input_ids"].tolist() for r in tidal.Dataset(seg["file"])]
                tokens += files[seg["file"]][seg["row"]][seg["start"] : seg["end"]]
            rows.append(tokens)
        rebuilt.append(rows)
    assert len(files) > 1
    assert rebuilt == [token_rows(b) for b in seen]


def test_records_skipped_as_bad_keep_the_rows_of_the_others(tmp_path: Path) -> None:
    root = write_records(tmp_path / "web")
    lines = (root / "part-1.jsonl").read_text().splitlines()
    lines[3] = lines[17] = "{not json"
    (root / "part-1.jsonl").write_text("\n".join(lines) + "\n")
    ds = tidal.Dataset(root, errors="skip").shuffle(seed=3, block_size=64).batch(4)
    state = saved_after(ds, 0, 2)
    seen = resumed(ds, state, 0, 20)
    traced = tidal.trace(ds, state, steps=20)
    assert [rebuild_ids(b) for b in traced] == [ids(b) for b in seen]


def test_unbatched_items_and_nested_mixtures(tmp_path: Path) -> None:
    a = tidal.Dataset(write_records(tmp_path / "a", offset=0)).repeat()
    b = tidal.Dataset(write_records(tmp_path / "b", shards=1, offset=10_000)).repeat()
    c = tidal.Dataset(write_records(tmp_path / "c", shards=1, offset=20_000)).repeat()
    inner = tidal.mix({"b": b, "c": c}, weights={"b": 0.5, "c": 0.5}, seed=1)
    ds = tidal.mix({"a": a, "bc": inner}, weights={"a": 0.5, "bc": 0.5}, seed=0)
    state = saved_after(ds, 0, 7)
    seen = resumed(ds, state, 0, 12)
    traced = tidal.trace(ds, state, steps=12)
    assert all(len(b) == 1 for b in traced)  # an unbatched item is a batch of one row
    assert [read_back(b[0][0])["id"] for b in traced] == [int(x["id"]) for x in seen]
    names = {b[0][0]["stream"] for b in traced}
    assert names <= {"a", "bc/b", "bc/c"} and len(names) >= 2


def test_a_chain_it_cannot_follow_is_untraceable(data: Path) -> None:
    ds = tidal.Dataset(data).tokenize(word_tokenizer(), eos="<eos>").pack(8).pack(16).batch(2)
    state = saved_after(ds, 0, 1)
    with pytest.raises(tidal.Untraceable, match="pack"):
        tidal.trace(ds, state, steps=1)


@pytest.mark.parametrize("continuous", [False, True])
def test_a_jax_loader_state_traces_the_same_way(data: Path, continuous: bool) -> None:
    pytest.importorskip("jax")
    import tidal.jax

    ds = tidal.Dataset(data).shuffle(seed=2, block_size=32).repeat().tokenize(word_tokenizer(), eos="<eos>")
    ds = ds.pack(16).batch(4, continuous=continuous)
    loader = tidal.jax.Loader(ds, num_workers=2)
    for _ in itertools.islice(loader, 3):
        pass
    state = json.loads(json.dumps(loader.state_dict()))
    again = tidal.jax.Loader(ds, num_workers=2)
    again.load_state_dict(state)
    seen = [[[int(x) for x in row] for row in np.asarray(b["input_ids"])] for b in itertools.islice(again, 4)]
    assert [rebuild_tokens(b) for b in tidal.trace(ds, state, steps=4)] == seen


def test_every_rank_and_a_restore_on_fewer_ranks(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = tidal.Dataset(data).shuffle(seed=6, block_size=32).batch(3)
    per_rank, rest = [], {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = tidal.DataLoader(ds, num_workers=2)
        it = iter(loader)
        for _ in range(3):
            next(it)
        per_rank.append(json.loads(json.dumps(loader.state_dict())))
        rest[rank] = [ids(b) for b in itertools.islice(it, 5)]
        del it
    state = tidal.state.merge(per_rank)
    for rank in (0, 1):
        traced = tidal.trace(ds, state, steps=5, rank=rank)
        assert [rebuild_ids(b) for b in traced] == rest[rank]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    seen = resumed(ds, state, 0, 7)  # the two ranks' state, restored on one
    traced = tidal.trace(ds, state, steps=7, world_size=1, num_workers=0)
    assert [rebuild_ids(b) for b in traced] == [ids(b) for b in seen]


def test_a_mixture_of_packed_streams(tmp_path: Path) -> None:
    tok = word_tokenizer()
    web = tidal.Dataset(write_records(tmp_path / "web")).shuffle(seed=0).repeat().tokenize(tok, eos="<eos>").pack(12)
    code = tidal.Dataset(write_records(tmp_path / "code", shards=1, offset=7)).repeat().tokenize(tok, eos="<eos>")
    ds = tidal.mix({"web": web, "code": code.pack(12, "best_fit", buffer_size=2)}, seed=3).batch(4)
    state = saved_after(ds, 2, 3)
    seen = resumed(ds, state, 2, 5)
    traced = tidal.trace(ds, state, steps=5)
    assert [rebuild_tokens(b) for b in traced] == [unpadded(b) for b in seen]
    for b in traced:
        for row in b:
            assert len({seg["stream"] for seg in row}) == 1  # a packed row is of one stream
            assert ("/code/" in row[0]["file"]) == (row[0]["stream"] == "code")


@pytest.mark.parametrize("shuffled", [False, True])  # in order, blocks stay Arrow: pack reads values and offsets
@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_an_arrow_column_of_token_ids_packs_by_token_ranges(tmp_path: Path, strategy: str, shuffled: bool) -> None:
    root = tmp_path / "ids"
    root.mkdir()
    rng = np.random.default_rng(1)
    for s in range(3):
        docs = [rng.integers(0, 900, rng.integers(1, 30)).tolist() for _ in range(25)]
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), root / f"p{s}.parquet")
    ds = tidal.Dataset(root).shuffle(seed=4, block_size=20) if shuffled else tidal.Dataset(root)
    ds = ds.pack(16, strategy, eos=999, buffer_size=2).batch(2)
    state = saved_after(ds, 2, 3)
    seen = resumed(ds, state, 2, 6)
    traced = tidal.trace(ds, state, steps=6)
    rebuilt = [
        [[t for seg in row for t in ([*read_back(seg)["input_ids"], 999][seg["start"] : seg["end"]])] for row in b]
        for b in traced
    ]
    assert rebuilt == [unpadded(b) for b in seen]


@pytest.mark.parametrize(("workers", "after"), [(0, 0), (0, 2), (2, 0), (2, 2)])
def test_a_trace_follows_the_weights_set_on_the_loader(tmp_path: Path, workers: int, after: int) -> None:
    # set_weights is recorded in the state: the trace draws with the weights in force, as the
    # resumed loader does, and names the stream of every row
    web = tidal.Dataset(write_records(tmp_path / "web", offset=0)).shuffle(seed=0).repeat()
    code = tidal.Dataset(write_records(tmp_path / "code", shards=2, offset=50_000)).repeat()
    ds = tidal.mix({"web": web, "code": code}, weights={"web": 0.9, "code": 0.1}, seed=2).batch(6)
    loader = tidal.DataLoader(ds, num_workers=workers)
    it = iter(loader)
    for _ in range(2):
        next(it)
    loader.set_weights({"web": 0.0, "code": 1.0})
    for _ in range(after):  # 0: saved before any batch drawn under the new weights
        next(it)
    state = loader.state_dict()
    seen = [next(it) for _ in range(5)]
    traced = tidal.trace(ds, state, steps=5)
    assert [rebuild_ids(b) for b in traced] == [ids(b) for b in seen]
    assert {seg["stream"] for b in traced for row in b for seg in row} == {"code"}


# -- no state, a loader's own batching, errors that say what differs -------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_no_state_traces_from_the_start_of_the_run(data: Path, workers: int) -> None:
    ds = tidal.Dataset(data).shuffle(seed=4, block_size=16).batch(5)
    first = list(itertools.islice(tidal.DataLoader(ds, num_workers=workers), 6))
    traced = tidal.trace(ds, None, steps=6, num_workers=workers)
    assert [rebuild_ids(b) for b in traced] == [ids(b) for b in first]
    assert tidal.trace(ds, None, steps=2, skip=4, num_workers=workers) == traced[4:]


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_loader_that_batched_the_dataset_itself_is_traced_on_the_dataset(data: Path, drop_last: bool) -> None:
    """DataLoader(ds, batch_size=4): the state's fixed batch size says how the loader batched ds."""
    ds = tidal.Dataset(data).shuffle(seed=2, block_size=16)
    loader = tidal.DataLoader(ds, batch_size=4, drop_last=drop_last, num_workers=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [ids(b) for b in itertools.islice(it, 4)]
    del it
    assert [rebuild_ids(b) for b in tidal.trace(ds, state, steps=4)] == rest
    assert [rebuild_ids(b) for b in tidal.trace(ds, state, steps=4, batch_size=4, drop_last=drop_last)] == rest


def test_packed_batches_a_loader_made_are_traced_with_its_batch_size(data: Path) -> None:
    """Packed batches hold no fixed number of records, so the state cannot say the batch size:
    batch_size= does, and the error without it says so."""
    ds = tidal.Dataset(data).shuffle(seed=1, block_size=16).tokenize(word_tokenizer(), eos="<eos>").pack(24)
    loader = tidal.DataLoader(ds, batch_size=3, num_workers=0)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [token_rows(b) for b in itertools.islice(it, 2)]
    del it
    with pytest.raises(tidal.StateError, match=r"trace with batch_size=n"):
        tidal.trace(ds, state, steps=2)
    assert [rebuild_tokens(b) for b in tidal.trace(ds, state, steps=2, batch_size=3)] == rest
    with pytest.raises(tidal.ArgumentError, match="already batched"):
        tidal.trace(ds.batch(3), state, steps=2, batch_size=3)


def test_a_foreign_state_says_what_differs_and_names_its_file(data: Path, tmp_path: Path) -> None:
    ds = tidal.Dataset(data).shuffle(seed=2, block_size=16).batch(4)
    state = saved_after(ds, 0, 2)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    fewer = tidal.Dataset(write_records(tmp_path / "fewer", shards=2)).shuffle(seed=2, block_size=16).batch(4)
    with pytest.raises(
        tidal.StateError, match=r"other files \(the state's sources: files: 120 records; this dataset's: files: 80"
    ):
        tidal.trace(fewer, state, steps=1)
    with pytest.raises(tidal.StateError, match=r"its items hold 4 records each, this dataset's 5"):
        tidal.trace(tidal.Dataset(data).shuffle(seed=2, block_size=16).batch(5), state, steps=1)
    with pytest.raises(
        tidal.StateError, match=rf"^{path}: this state was saved from a different dataset: .*another seed"
    ):
        tidal.trace(tidal.Dataset(data).shuffle(seed=3, block_size=16).batch(4), path, steps=1)
    with pytest.raises(tidal.StateError, match=rf"^{tmp_path / 'nope.json'}: no such state file$"):
        tidal.trace(ds, tmp_path / "nope.json", steps=1)
    (tmp_path / "notes.json").write_text("[1, 2")
    with pytest.raises(tidal.StateError, match=rf"^{tmp_path / 'notes.json'}: not JSON: .* at line 1, column 6$"):
        tidal.trace(ds, tmp_path / "notes.json", steps=1)
