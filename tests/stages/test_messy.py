"""Messy records as real corpora hold them: nulls, optional fields, records a stage cannot use.

A null where a stage needs a value is a RecordError naming the file and row, put to the
``errors`` policy like any bad record, in the training process and in DataLoader workers.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from makers import EOS, word_tokenizer  # token k is the word "k"

import tidal


def corpus(root: Path, bad: dict[tuple[int, int], dict], files: int = 3, rows: int = 20) -> Path:
    """``files`` JSON lines files of ``rows`` documents ``{"id", "text"[, "lang"]}``; ``bad``
    replaces record ``(file, row)``."""
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lines = []
        for r in range(rows):
            rec: dict = {"id": f * 1000 + r, "text": f"{f} {r} {r}"}
            if r % 3 == 0:
                rec["lang"] = "en"  # an optional field, as web dumps have
            lines.append(json.dumps(bad.get((f, r), rec)))
        (root / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return root


BAD = {(1, 5): {"id": 1005, "text": None}, (2, 11): {"id": 2011}, (0, 7): {"id": 7, "text": 42}}


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_record_tokenize_cannot_use_names_its_file_and_row(tmp_path: Path, shuffled: bool) -> None:
    root = corpus(tmp_path / "c", BAD)
    ds = tidal.Dataset(root)
    ds = ds.shuffle(seed=3, block_size=25) if shuffled else ds
    with pytest.raises(tidal.RecordError, match=r"part-\d\.jsonl, row \d+: tokenize: column 'text' must hold a string"):
        list(ds.tokenize(word_tokenizer(), eos=EOS))
    errors: list[tidal.RecordError] = []
    ds = tidal.Dataset(root, errors=errors.append)
    ds = ds.shuffle(seed=3, block_size=25) if shuffled else ds
    got = list(ds.tokenize(word_tokenizer(), eos=EOS))
    assert len(got) == 60 - 3 and {r["id"] for r in got}.isdisjoint({1005, 2011, 7})
    where = sorted((Path(e.path).name, e.row) for e in errors)
    assert where == [("part-0.jsonl", 7), ("part-1.jsonl", 5), ("part-2.jsonl", 11)]
    found = {e.row: str(e) for e in errors}
    assert "found int" in found[7] and "found NoneType" in found[5] and "found no such field" in found[11]


def test_skipped_records_are_counted_and_the_rest_read_once(tmp_path: Path) -> None:
    root = corpus(tmp_path / "c", BAD)
    ds = tidal.Dataset(root, errors="skip").shuffle(seed=1, block_size=16).filter(keep_odd_rows)
    it = iter(ds.tokenize(word_tokenizer(), eos=EOS))
    got = [r["id"] for r in it]
    # the filter drops even rows: row 5 of file 1, row 11 of file 2 and row 7 of file 0 reach tokenize
    want = {f * 1000 + r for f in range(3) for r in range(20) if r % 2} - {1005, 2011, 7}
    assert sorted(got) == sorted(want)
    assert it.stats()["skipped"] == 3


def keep_odd_rows(rec: dict) -> bool:
    return rec["id"] % 2 == 1


def test_a_mixture_names_the_file_of_the_stream_the_record_came_from(tmp_path: Path) -> None:
    clean = corpus(tmp_path / "clean", {})
    messy = corpus(tmp_path / "messy", {(1, 5): {"id": 1005, "text": None}})
    mixed = tidal.mix({"clean": tidal.Dataset(clean), "messy": tidal.Dataset(messy)}, weights=[0.5, 0.5], seed=0)
    with pytest.raises(tidal.RecordError, match=r"messy/part-1\.jsonl, row 5: tokenize"):
        list(mixed.tokenize(word_tokenizer(), eos=EOS))
    mixed = tidal.mix(
        {"clean": tidal.Dataset(clean), "messy": tidal.Dataset(messy, errors="skip")}, weights=[0.5, 0.5], seed=0
    )
    it = iter(mixed.tokenize(word_tokenizer(), eos=EOS))
    ids = [r["id"] for r in it]
    assert ids.count(1005) <= 1 and it.stats()["skipped"] == 1  # the clean stream's 1005, not the null one


@pytest.mark.parametrize("errors", ["raise", "skip", "function"])
def test_a_column_no_record_has_is_a_schema_error_not_a_stream_of_skips(tmp_path: Path, errors: str) -> None:
    root = corpus(tmp_path / "c", {}, files=4)
    policy = functools.partial(collect, []) if errors == "function" else errors
    # the first 64 records, whatever the policy: under "raise" the records after the first are read before it raises
    with pytest.raises(
        tidal.SchemaError, match=r"none of the first \d+ records has a column 'body' \(they have \['id', "
    ):
        list(tidal.Dataset(root, errors=policy).tokenize(word_tokenizer(), column="body", eos=EOS))
    with pytest.raises(tidal.SchemaError, match=r"none of the first \d+ records has a column 'ids'.*tokenize"):
        list(tidal.Dataset(root, errors=policy).pack(8, column="ids"))
    # fewer records than that: all of them, at the end of the stream (of each reader's share, in a loader)
    small = corpus(tmp_path / "small", {}, files=1, rows=5)
    for ds in (
        tidal.Dataset(small, errors=policy).tokenize(word_tokenizer(), column="body", eos=EOS),
        tidal.Dataset(small, errors=policy).pack(8, column="ids"),
        tidal.Dataset(small, errors=policy).pack(8, column="ids", strategy="best_fit"),
    ):
        with pytest.raises(tidal.SchemaError, match=r"none of the 5 records it was given has a column '(body|ids)'"):
            list(ds)
    ds = tidal.Dataset(small, errors=policy).tokenize(word_tokenizer(), column="body", eos=EOS).batch(2)
    with pytest.raises(tidal.SchemaError, match=r"none of the 2 records it was given has a column 'body'"):
        list(tidal.DataLoader(ds, num_workers=2))


def test_a_column_only_later_records_have_is_their_bad_records(tmp_path: Path) -> None:
    """Under "raise" the records after a bad one are only looked at: a column a later record has
    leaves the first record's own error, and a record of the next block is no typo either."""
    root = corpus(tmp_path / "c", {(0, r): {"id": r} for r in range(19)}, files=2)
    with pytest.raises(tidal.RecordError, match=r"part-0.jsonl, row 0: tokenize: .*found no such field \(fields: id\)"):
        list(tidal.Dataset(root).tokenize(word_tokenizer(), eos=EOS))
    it = iter(tidal.Dataset(root, errors="skip").tokenize(word_tokenizer(), eos=EOS))
    assert len(list(it)) == 21 and it.stats()["skipped"] == 19
    # a few records without the column (an optional field is not a typo): records the policy takes
    root = corpus(tmp_path / "lang", {}, files=4)
    with pytest.raises(tidal.RecordError, match=r"part-0.jsonl, row 1: tokenize: column 'lang' must hold a string"):
        list(tidal.Dataset(root).tokenize(word_tokenizer(), column="lang", eos=EOS))
    it = iter(tidal.Dataset(root, errors="skip").tokenize(word_tokenizer(), column="lang", eos=EOS))
    assert len(list(it)) == 28 and it.stats()["skipped"] == 52


def test_a_null_document_pack_cannot_pack_names_its_file_and_row(tmp_path: Path) -> None:
    ids = pa.array([[1, 2, 3], None, [4, 5], [6, 7, 8, 9], [], [10, 11]], type=pa.list_(pa.int32()))
    pq.write_table(pa.table({"ids": ids}), tmp_path / "ids.parquet")
    with pytest.raises(tidal.RecordError, match=r"ids\.parquet, row 1: pack\(\): column 'ids' must hold 1-D integer"):
        list(tidal.Dataset(tmp_path).pack(4, column="ids", eos=0))
    it = iter(tidal.Dataset(tmp_path, errors="skip").pack(4, column="ids", eos=0))
    tokens = np.concatenate([s["input_ids"] for s in it]).tolist()
    assert tokens == [1, 2, 3, 0, 4, 5, 0, 6, 7, 8, 9, 0]  # the rest, 0 10 11 0, is shorter than a sequence + 1
    assert it.stats()["skipped"] == 1
    it = iter(tidal.Dataset(tmp_path, errors="skip").pack(4, column="ids", eos=0, strategy="best_fit"))
    assert sum(int((s["input_ids"] != 0).sum()) for s in it) == 11 and it.stats()["skipped"] == 1


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, None), (2, "spawn")])
def test_a_loader_skips_what_tokenize_cannot_use_in_workers_too(tmp_path: Path, workers: int, context: str) -> None:
    root = corpus(tmp_path / "c", BAD)
    with (root / "part-0.jsonl").open("a") as f:
        f.write(
            '{"id": 99, "text": "cut\n[1, 2]\n'
        )  # and lines that are not objects: each counted once, not per worker
    ds = tidal.Dataset(root).shuffle(seed=2).tokenize(word_tokenizer(), eos=EOS).batch(4, drop_last=False)
    with pytest.raises(tidal.RecordError, match=r"part-\d\.jsonl, (row|line) \d+: "):
        for _ in tidal.DataLoader(ds, num_workers=workers):
            pass
    ds = (
        tidal.Dataset(root, errors="skip").shuffle(seed=2).tokenize(word_tokenizer(), eos=EOS).batch(4, drop_last=False)
    )
    loader = tidal.DataLoader(ds, num_workers=workers, multiprocessing_context=context)
    ids = sorted(i for batch in loader for i in batch["id"].tolist())
    assert ids == sorted({f * 1000 + r for f in range(3) for r in range(20)} - {1005, 2011, 7})
    assert loader.stats()["skipped"] == 5


@pytest.mark.parametrize("workers", [0, 2])
def test_optional_fields_batch_with_none_where_a_record_lacks_one(tmp_path: Path, workers: int) -> None:
    root = corpus(tmp_path / "c", {})
    for ds in (tidal.Dataset(root), tidal.Dataset(root, columns=["id", "lang"])):
        batches = list(tidal.DataLoader(ds.batch(6), num_workers=workers))
        ids = [i for b in batches for i in b["id"].tolist()]
        langs = [x for b in batches for x in b["lang"]]
        assert sorted(ids) == sorted(f * 1000 + r for f in range(3) for r in range(20))
        assert [lang for i, lang in zip(ids, langs, strict=True) if i % 1000 % 3 == 0] == ["en"] * 21
        assert langs.count(None) == 60 - 21


def test_a_webdataset_sample_without_a_field_asked_for_has_none_there(tmp_path: Path) -> None:
    import io
    import tarfile

    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for i in range(4):
            members = {"txt": f"doc {i}".encode()} | ({"json": b'{"lang": "en"}'} if i % 2 == 0 else {})
            for ext, data in members.items():
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    got = list(tidal.Dataset(tmp_path, columns=["txt", "json"]))
    assert [r["json"] for r in got] == [{"lang": "en"}, None, {"lang": "en"}, None]
    with pytest.raises(tidal.SchemaError, match=r"no webdataset file has a field 'jsn'"):
        tidal.Dataset(tmp_path, columns=["txt", "jsn"])


# -- a property: messy records, every one yielded once or counted where it is ---------------------

GOOD, NULL_TEXT, NO_TEXT, NUMBER_TEXT, NOT_JSON, NOT_OBJECT, OPTIONAL = range(7)


def line_of(kind: int, rid: int) -> str:
    return {
        GOOD: json.dumps({"id": rid, "text": f"{rid % 7} {rid % 5}"}),
        OPTIONAL: json.dumps({"id": rid, "text": "1 2", "lang": None if rid % 2 else "en"}),
        NULL_TEXT: json.dumps({"id": rid, "text": None}),
        NO_TEXT: json.dumps({"id": rid, "lang": "en"}),
        NUMBER_TEXT: json.dumps({"id": rid, "text": rid}),
        NOT_JSON: '{"id": ' + str(rid) + ', "text": "cut',
        NOT_OBJECT: json.dumps([rid, "text"]),
    }[kind]


def collect(errors: list[tidal.TidalError], error: tidal.TidalError) -> None:
    errors.append(error)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=25), min_size=1, max_size=5),
    seed=st.integers(0, 3),
    block=st.sampled_from([4, 16, 1000]),
    workers=st.sampled_from([1, 2]),
)
def test_every_messy_record_is_yielded_once_or_counted_with_its_file_and_place(
    tmp_path_factory: pytest.TempPathFactory, files: list[list[int]], seed: int, block: int, workers: int
) -> None:
    if sum(map(len, files)) % workers:
        files[0].append(GOOD)  # an epoch that readers share evenly: no remainder dropped
    root = tmp_path_factory.mktemp("messy")
    good, bad = set(), set()
    rid = 0
    for f, kinds in enumerate(files):
        lines = []
        for i, kind in enumerate(kinds):
            lines.append(line_of(kind, rid))
            name = f"part-{f}.jsonl"
            if kind in (GOOD, OPTIONAL):
                good.add(rid)
            else:  # a line that does not parse is named by its line, a record tokenize cannot use by its row
                bad.add((name, "line", i + 1) if kind in (NOT_JSON, NOT_OBJECT) else (name, "row", i))
            rid += 1
        (root / name).write_text("\n".join(lines) + "\n")
    errors: list[tidal.TidalError] = []
    ds = tidal.Dataset(root, errors=functools.partial(collect, errors)).shuffle(seed=seed, block_size=block)
    ds = ds.tokenize(word_tokenizer(), eos=EOS)
    seen: list[int] = []
    skipped = 0
    for w in range(workers):
        it = ds.iterator(tidal.World(0, 1, w, workers))
        got: list[int] = []
        try:
            for r in it:
                got.append(r["id"])
        except tidal.SchemaError as exc:  # a reader given only records without text: a typo, as far as it can tell
            assert re.search(r"none of the \d+ records it was given has a column 'text'", str(exc)) and not got
        seen += got
        skipped += it.stats()["skipped"]  # each record without text handed to the policy all the same
    assert sorted(seen) == sorted(good)  # each good record once
    where = {(Path(e.path).name, "line" if e.line is not None else "row", e.line or e.row) for e in errors}
    assert isinstance(errors[0], tidal.RecordError) if errors else True
    assert where == bad and len(errors) == len(bad) == skipped


@pytest.mark.parametrize("readers", [1, 2, 3])
def test_bad_csv_rows_are_reported_once_by_the_reader_that_owns_them(tmp_path: Path, readers: int) -> None:
    rows = ["text,score"] + [f"t{i},{i}" for i in range(60)]
    rows[8] = "t7,7,extra"  # row 7, line 9
    rows[41] = "t40"  # row 40, line 42
    (tmp_path / "a.csv").write_text("\n".join(rows) + "\n")
    errors: list[tidal.TidalError] = []
    ds = tidal.Dataset(tmp_path, errors=functools.partial(collect, errors)).shuffle(seed=5, block_size=16)
    seen = []
    for w in range(readers):
        it = ds.iterator(tidal.World(0, 1, w, readers))
        seen += [r["text"] for r in it]
    assert sorted((e.line, e.row) for e in errors) == [(9, 7), (42, 40)]
    assert all("wrong number of fields" in str(e) for e in errors)
    assert len(seen) + 2 == 60 and len(set(seen)) == len(seen)  # 60 rows: no remainder for 1, 2 or 3 readers


def test_csv_types_are_the_datasets_and_text_keeps_na(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("text,score\na,1\nb,2\n")
    (tmp_path / "b.csv").write_text("text,score\nNA,x\nnull,\n")
    (tmp_path / "c.csv").write_text("text,score\nn/a,n/a\nd,4\n")
    got = {r["text"]: r["score"] for r in tidal.Dataset(tmp_path)}
    # score is text in b.csv: text in every file (one type per column), which keeps n/a and "" as they are
    assert got == {"a": "1", "b": "2", "NA": "x", "null": "", "n/a": "n/a", "d": "4"}
    for workers in (0, 2):
        batches = list(tidal.DataLoader(tidal.Dataset(tmp_path).batch(3), num_workers=workers))
        assert {t: s for b in batches for t, s in zip(b["text"], b["score"], strict=True)} == got
    (tmp_path / "b.csv").unlink()
    got = {r["text"]: r["score"] for r in tidal.Dataset(tmp_path)}
    assert got == {"a": 1, "b": 2, "n/a": None, "d": 4}  # numbers in every file: n/a is None
