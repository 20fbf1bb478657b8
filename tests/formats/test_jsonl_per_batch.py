"""JSON lines are held as their lines and parsed batch by batch (tidal.formats.jsonl): the first
batch of a block waits for its lines, not for every record of it, and bad lines still meet the
errors policy exactly once, by the reader that yields them, naming the file and line."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

import tidal
from tidal.formats import jsonl
from tidal.testing import assert_resumes_exactly, read_partitioned

BAD = {13, 77, 78, 300, 511}  # ids whose line is broken


def write(tmp_path: Path, files: int = 4, rows: int = 160, bad: set[int] = BAD) -> set[int]:
    """``files`` JSON lines files of ``rows`` records each, ids in order; returns the good ids."""
    rng = random.Random(0)
    good = set()
    for f in range(files):
        lines = []
        for r in range(rows):
            i = f * rows + r
            if i in bad:
                lines.append(f'{{"id": {i}, "text": "broken' if i % 2 else "[1, 2]")
            else:
                record = {"id": i, "text": "x" * rng.randrange(1, 50)}
                if i % 7 == 0:
                    record["lang"] = "en"  # an optional field
                lines.append(json.dumps(record))
                good.add(i)
        (tmp_path / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return good


def test_a_blocks_first_batch_parses_only_its_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, bad=set())
    parsed = Counter[int]()
    loads = jsonl.loads

    def counting(data):  # type: ignore[no-untyped-def]
        parsed["lines"] += 1
        return loads(data)

    monkeypatch.setattr(jsonl, "loads", counting)
    it = tidal.Dataset(tmp_path).shuffle(seed=3, block_size=400).batch(8).iterator()
    first = next(it)
    assert len(first["id"]) == 8 and parsed["lines"] == 8  # not the block's 400
    rest = list(it)
    assert parsed["lines"] == 640 and sum(len(b["id"]) for b in rest) == 632  # each record parsed once


@pytest.mark.parametrize("world_size, workers", [(1, 1), (2, 3)])
def test_bad_lines_are_skipped_once_by_the_reader_that_yields_them(
    tmp_path: Path, world_size: int, workers: int
) -> None:
    good = write(tmp_path)
    ds = tidal.Dataset(tmp_path, errors="skip").shuffle(seed=5, block_size=200)
    seen, skipped = Counter[int](), 0
    for rank in range(world_size):
        for worker in range(workers):
            it = ds.iterator(tidal.World(rank, world_size, worker, workers))
            seen.update(r["id"] for r in it)
            skipped += it.stats()["skipped"]
            it.close()
    assert max(seen.values()) == 1 and set(seen) <= good
    assert skipped == len(BAD)  # each counted once in the job
    assert len(good) - len(seen) < world_size * workers  # bar the remainder of the epoch
    parts = read_partitioned(ds, world_size, workers)
    assert sum(len(items) for per_rank in parts for items in per_rank) == len(seen)


def test_a_bad_line_is_raised_naming_its_file_line_and_row(tmp_path: Path) -> None:
    write(tmp_path)
    it = tidal.Dataset(tmp_path).batch(16).iterator()
    with pytest.raises(tidal.RecordError, match=r"part-0\.jsonl, line 14.*malformed JSON") as caught:
        for _ in it:
            pass
    assert caught.value.row == 13 and caught.value.line == 14


def test_a_function_policy_sees_every_bad_line_once(tmp_path: Path) -> None:
    write(tmp_path)
    errors: list[tidal.RecordError] = []
    ds = tidal.Dataset(tmp_path, errors=errors.append).shuffle(seed=2, block_size=300)
    got = [r["id"] for r in ds]
    assert sorted((e.path.rsplit("/", 1)[-1], e.row) for e in errors) == sorted(
        (f"part-{i // 160}.jsonl", i % 160) for i in BAD
    )
    assert len(got) == 640 - len(BAD)


def test_resumes_exactly_across_bad_lines(tmp_path: Path) -> None:
    write(tmp_path, files=3, rows=60, bad={5, 6, 7, 100, 150})
    ds = tidal.Dataset(tmp_path, errors="skip").shuffle(seed=4, block_size=50).batch(4)
    assert assert_resumes_exactly(ds, every=3, horizon=6) > 0


def test_trace_names_the_rows_of_a_batch_a_bad_line_was_dropped_from(tmp_path: Path) -> None:
    write(tmp_path, files=1, rows=40, bad={2, 3})
    ds = tidal.Dataset(tmp_path, errors="skip").batch(6)  # in file order: the first batch lost ids 2 and 3
    state = tidal.DataLoader(ds).state_dict()
    batches = tidal.trace(ds, state, steps=2)
    rows = [[segments[0]["row"] for segments in batch] for batch in batches]
    assert rows == [[0, 1, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13]]
    first = next(iter(ds))
    assert list(map(int, first["id"])) == [0, 1, 4, 5, 6, 7]


def test_a_column_no_record_of_a_block_has_is_still_an_error(tmp_path: Path) -> None:
    write(tmp_path, bad=set())
    with pytest.raises(tidal.SchemaError, match=r"'lnag'.*part-\d\.jsonl, line \d+ has the fields id, (lang, )?text"):
        next(iter(tidal.Dataset(tmp_path, columns=["id", "lnag"]).shuffle(seed=1)))
    # a field one record in seven has is no typo: None where a record lacks it
    langs = Counter(r["lang"] for r in tidal.Dataset(tmp_path, columns=["id", "lang"]).shuffle(seed=1))
    assert langs == {"en": 92, None: 548}


def test_a_rare_field_found_only_by_parsing_is_kept(tmp_path: Path) -> None:
    # its key written with an escape: no quoted name in the bytes, so the block is parsed to look
    (tmp_path / "a.jsonl").write_text('{"id": 0}\n{"id": 1, "\\u006cang": "fr"}\n{"id": 2}\n')
    assert [r["lang"] for r in tidal.Dataset(tmp_path, columns=["id", "lang"])] == [None, "fr", None]
